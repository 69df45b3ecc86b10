// peer_fixture.mjs: what every llama.cpp fixture of tools/gemma4_*.mjs
// records about the peer that made it and the model file it read.
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { basename, join } from 'node:path';

// node-llama-cpp's package.json and release file, read from the peer folder
export const peerInfo = (peer) => {
  const nlc = join(peer, 'node_modules/node-llama-cpp');
  return {
    pkg: JSON.parse(readFileSync(join(nlc, 'package.json'), 'utf8')),
    release: JSON.parse(readFileSync(join(nlc, 'llama/binariesGithubRelease.json'), 'utf8')),
  };
};

// the fixture's first fields: format, engine, versions, CPU, generator
export const fixtureHead = (format, generator, { pkg, release }, llama) => ({
  format,
  engine: `llama.cpp (via node-llama-cpp ${pkg.version} prebuilt)`,
  node_llama_cpp_version: pkg.version,
  llama_cpp_release: release.release,
  system_info: llama.systemInfo.trim(),
  generator,
});

// the model file: name, sha256 and size
export const fileEntry = (file) => ({
  file: basename(file), sha256: createHash('sha256').update(readFileSync(file)).digest('hex'),
  size_bytes: statSync(file).size,
});
