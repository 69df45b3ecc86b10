// gemma4_tokenize_fixtures.mjs: llama.cpp's tokenization of hard strings with
// a gemma 4 vocabulary of the kind real gemma 4 GGUFs carry
// (tokenizer.ggml.model "gemma4": BPE over text whose spaces are U+2581, with
// <0xNN> byte fallback), the fixture tests/fixtures/gemma4/*.tokenize.json
// that `ctest -R tokenizer` checks the engine with.
//
//   cp -r ../shared/bench /tmp/llama-peer && (cd /tmp/llama-peer && npm install --no-audit --no-fund)
//   cmake --build build          # writes models/gemma4/tiny-dense-gemma4vocab-f32.gguf
//   node tools/gemma4_tokenize_fixtures.mjs --peer /tmp/llama-peer
//
// node-llama-cpp 3.22.1 is a peer, loaded from --peer, never a dependency.
// String cases go through its JavaScript API (model.tokenize: common_tokenize
// with add_special false; model.detokenize: llama_detokenize with
// remove_special false), each string with parse_special false and true. Raw
// cases are byte strings, invalid UTF-8 among them, which the JavaScript API
// cannot pass: tools/llama_tokenize_raw.c is compiled against the peer's own
// prebuilt libllama (headers from the llama.cpp source bundle it ships) and
// run once per case, so a case where llama.cpp throws is recorded as "error".
// The format is ../shared/reference's tokenize-v1.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fileEntry, fixtureHead, peerInfo } from './peer_fixture.mjs';

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const peer = opt('--peer', '/tmp/llama-peer');
const file = opt('--model', 'models/gemma4/tiny-dense-gemma4vocab-f32.gguf');
const out = opt('--out', 'tests/fixtures/gemma4/tiny-dense-gemma4vocab-f32.tokenize.json');
const here = dirname(fileURLToPath(import.meta.url));

const nlc = join(peer, 'node_modules/node-llama-cpp');
const { getLlama, LlamaLogLevel } = await import(join(nlc, 'dist/index.js'));
const info = peerInfo(peer);

// the strings: spaces, newlines, digits, unicode, emoji, chat markers
const STRINGS = [
  'Hello world', 'Once upon a time the little dog went to the park.', '',
  ' ', '  ', '   leading spaces', 'trailing spaces   ', 'double  space  inside', ' x', 'x ',
  '\n', '\n\n', '\n\n\n', '\n\n\n\n', '\n\n\n\n\n', '\n\n\n\n\n\n\n\n\n', 'a\nb', 'a\n\nb', ' \n ', '\n x\n',
  'line one\r\nline two\r\n', '\ttab\tseparated\t', '\t\t\n\t',
  '2024', '1000 questions', '12.5 percent', '3.14159265358979', '0123456789', '1,000,000', '-42',
  'caf\u00e9 na\u00efve \u00fcber fa\u00e7ade ni\u00f1o', 'cafe\u0301 (NFD)', '\u65e5\u672c\u8a9e \u65e5\u672c',
  '\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440', '\u3053\u3093\u306b\u3061\u306f', '\uc548\ub155\ud558\uc138\uc694',
  '\u0645\u0631\u062d\u0628\u0627', '\u0928\u092e\u0938\u094d\u0924\u0947',
  '\ud83d\ude00', '\ud83d\udc4b\ud83c\udffd hi', '\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67', '\ud83c\uddee\ud83c\uddf9 flag',
  '\u2581 literal U+2581', '\u2581\u2581x', 'tab\u00a0nbsp\u2003emspace',
  '\ufffd replacement', '<0x41> text of a byte token',
  "don't can't I'm we're they've it's", ' ?!., punctuation !!! ...', 'def answer(q):\n    return q  # one\n',
  '{"key": [1, 2, 3], "x": null}', 'https://example.com/a?b=c&d=e',
  '<|turn>user\nWhat is a cartridge?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>The answer.<turn|>',
  '<bos>hi<eos>', '<pad><unk><mask>', '<|tool_call>call<tool_call|><|tool_response>ok<tool_response|>',
  '<|"|>quoted<|"|>', 'x<turn|>y', '</s>', '<unused0>', ' <|turn> spaced marker ',
];

// byte strings (hex), invalid UTF-8 among them
const RAW = [
  ['valid ASCII', '48656c6c6f20776f726c64'],
  ['lone continuation byte', '61806220'],
  ['truncated 2-byte sequence at the end', '6361666520c3'],
  ['truncated 3-byte sequence before a space', 'e697a520e6'],
  ['invalid lead bytes', 'c0c1f5ff20'],
  ['overlong slash', 'c0af2f'],
  ['encoded surrogate', 'eda080'],
  ['broken 4-byte emoji before a newline', 'f09f980a0a'],
  ['0xFF run with spaces', 'ffff20ff20'],
  ['NUL and control bytes', '00010203207f'],
  ['valid emoji then garbage', 'f09f9880fe'],
  ['newlines around invalid bytes', '0a800a0a81'],
  ['space then truncated U+2581', '20e29620'],
  ['U+2581 itself', 'e29681e29681'],
  ['chat marker next to invalid bytes', '3c7c7475726e3e80'],
  ['above U+10FFFF', 'f4908080'],
];

const bins = join(peer, 'node_modules/@node-llama-cpp/linux-x64/bins/linux-x64');
const work = mkdtempSync(join(tmpdir(), 'gemma4-tok-'));
const src = join(work, 'llama.cpp');
execFileSync('git', ['-c', 'advice.detachedHead=false', 'clone', '-q', join(nlc, 'llama/gitRelease.bundle'), src]);
const tool = join(work, 'llama_tokenize_raw');
execFileSync('cc', ['-O1', '-o', tool, join(here, 'llama_tokenize_raw.c'), `-I${join(src, 'include')}`,
  `-I${join(src, 'ggml/include')}`, `-L${bins}`, '-l:libllama.v0.5.0.so', `-Wl,-rpath,${bins}`]);

const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: file, gpuLayers: 0, vocabOnly: true });
const meta = model.fileInfo.metadata.tokenizer.ggml;

const cases = [];
for (const text of STRINGS) {
  for (const parse of [false, true]) {
    const ids = Array.from(model.tokenize(text, parse));
    cases.push({ text, parse_special: parse, ids, detok: model.detokenize(ids, false),
                 detok_special: model.detokenize(ids, true) });
  }
}
const raw = [];
for (const [label, hex] of RAW) {
  for (const parse of [false, true]) {
    try {
      const res = execFileSync(tool, [file, parse ? '1' : '0', hex], { stdio: ['ignore', 'pipe', 'ignore'] });
      raw.push({ label, parse_special: parse, hex, ...JSON.parse(res.toString()) });
    } catch (e) {
      raw.push({ label, parse_special: parse, hex, error: `llama.cpp aborted (status ${e.status}, signal ${e.signal})` });
    }
  }
}
rmSync(work, { recursive: true, force: true });

const fixture = {
  ...fixtureHead('cartridge-reference/tokenize-v1', 'tools/gemma4_tokenize_fixtures.mjs', info, llama),
  model: { ...fileEntry(file), tokenizer_model: meta.model, tokenizer_pre: meta.pre ?? null,
           n_vocab: meta.tokens.length, n_merges: meta.merges.length, bos_id: model.tokens.bos,
           eos_id: model.tokens.eos,
           made_by: 'recipes/make_model.lua --arch gemma4 --preset tiny-dense --tokenizer-model gemma4 --dtype f32' },
  definitions: {
    ids: 'common_tokenize(vocab, text, add_special=false, parse_special): never BOS/EOS',
    detok: 'llama_detokenize(ids, remove_special=false, unparse_special=false)',
    detok_special: 'llama_detokenize(ids, remove_special=false, unparse_special=true)',
    raw_cases: 'hex byte strings through the C API (tools/llama_tokenize_raw.c): llama_tokenize(add_special=false, ' +
      'parse_special); pieces_hex = llama_token_to_piece(lstrip=0, special=true) per id; detok_hex / ' +
      'detok_special_hex = llama_detokenize(remove_special=false, unparse_special=false / true); "error": ' +
      'llama.cpp aborted, there is nothing to match and an engine must not crash',
  },
  n_cases: cases.length,
  cases: '@CASES@',
  raw_cases: '@RAW@',
};
const text = JSON.stringify(fixture, null, 1)
  .replace('"@CASES@"', '[\n' + cases.map((c) => '  ' + JSON.stringify(c)).join(',\n') + '\n ]')
  .replace('"@RAW@"', '[\n' + raw.map((c) => '  ' + JSON.stringify(c)).join(',\n') + '\n ]');
writeFileSync(out, text + '\n');
console.log(`${out}: ${cases.length} string cases, ${raw.length} raw cases ` +
  `(${raw.filter((r) => r.error).length} where llama.cpp aborted), ${meta.tokens.length} tokens, ` +
  `${meta.merges.length} merges`);
await model.dispose();
await llama.dispose();
