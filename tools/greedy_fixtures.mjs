// greedy_fixtures.mjs: llama.cpp's greedy continuations of the engine's
// random-weight models, the parity fixtures that `ctest -R model` and
// `ctest -R gemma4` check the engine with. Two sets:
//   --set gemma4  the gemma4 presets at f32, f16 and q8_0 (models/gemma4, made
//                 by the build) -> tests/fixtures/gemma4
//   --set quant   the qwen3 `default` preset in the block types people
//                 download, q8_0 q6_K q5_K q4_K and q4_0 (models/quant, made
//                 by the build) -> tests/fixtures/quant
//   --set qwen2   the qwen2-tiny preset at f32, f16 and q8_0 (models/qwen2,
//                 made by the build) -> tests/fixtures/qwen2
//
//   cp -r ../shared/bench /tmp/llama-peer && (cd /tmp/llama-peer && npm install --no-audit --no-fund)
//   cmake --build build          # writes models/gemma4/*.gguf and models/quant/*.gguf
//   node tools/greedy_fixtures.mjs --set gemma4 --peer /tmp/llama-peer
//   node tools/greedy_fixtures.mjs --set quant --peer /tmp/llama-peer
//   node tools/greedy_fixtures.mjs --set qwen2 --peer /tmp/llama-peer
//
// node-llama-cpp 3.22.1 (llama.cpp release v0.5.0) is a peer to compare with,
// not a dependency: it is loaded from --peer. Settings as in
// ../shared/reference: 2 threads, CPU, f32 K and V cache, flash attention
// off, the whole prompt in one batch, then one token per decode call, greedy
// (argmax of the raw logits, ties to the lowest id). The gemma4 prompts are
// longer than the models' sliding window (32), so the sliding layers drop rows.
//
// Each prompt also records how far llama.cpp lands from itself, over the
// reported logits of every step: self_envelope with the prompt fed one token
// per call, flash_envelope with its flash-attention kernel (reference_check.h
// explains how the tests use them).
import { writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileEntry, fixtureHead, peerInfo } from './peer_fixture.mjs';

const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const set = opt('--set', 'gemma4');
const peer = opt('--peer', '/tmp/llama-peer');
const steps = parseInt(opt('--steps', '32'), 10);
const only = opt('--only', null); // one model name, e.g. tiny-moe-q8_0

const STORY = 'Once upon a time the little dog went to the park with Tom and Lily. They were very happy, and the dog ' +
  'ran after a red ball all day long. When the sun went down, they made their way back';
const CARTRIDGE = 'What is a cartridge? A cartridge is a small trained prefix that a model reads in place of a long ' +
  'corpus, so that it can answer each question about the corpus without reading it all again.';
const QUESTION = 'What does the model read in place of the long corpus, and why is that faster than reading all of ' +
  'the words again?';
const SETS = {
  gemma4: {
    models: ['tiny-dense-f32', 'tiny-dense-f16', 'tiny-dense-q8_0', 'tiny-moe-f32', 'tiny-moe-f16', 'tiny-moe-q8_0'],
    dir: 'models/gemma4', out: 'tests/fixtures/gemma4', bos: true,
    madeBy: (preset, dtype) => `recipes/make_model.lua --arch gemma4 --preset ${preset} --dtype ${dtype}`,
    prompts: [
      { prompt: STORY, parse_special: false },
      { prompt: CARTRIDGE, parse_special: false },
      { prompt: `<|turn>system\nYou answer questions about the corpus.<turn|>\n<|turn>user\n${QUESTION}<turn|>\n` +
                '<|turn>model\n<|channel>thought\n<channel|>', parse_special: true },
    ],
  },
  quant: {
    models: ['default-q8_0', 'default-q6_K', 'default-q5_K', 'default-q4_K', 'default-q4_0'],
    dir: 'models/quant', out: 'tests/fixtures/quant', bos: false,
    madeBy: (preset, dtype) => `recipes/make_model.lua --preset ${preset} --dtype ${dtype}`,
    prompts: [
      { prompt: STORY, parse_special: false },
      { prompt: CARTRIDGE, parse_special: false },
      { prompt: `<|im_start|>system\nYou answer questions about the corpus.<|im_end|>\n<|im_start|>user\n${QUESTION}` +
                '<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n', parse_special: true },
    ],
  },
  qwen2: {
    models: ['qwen2-tiny-f32', 'qwen2-tiny-f16', 'qwen2-tiny-q8_0'],
    dir: 'models/qwen2', out: 'tests/fixtures/qwen2', bos: false, arch: 'qwen2',
    madeBy: (preset, dtype) => `recipes/make_model.lua --preset ${preset} --dtype ${dtype}`,
    prompts: [
      { prompt: STORY, parse_special: false },
      { prompt: CARTRIDGE, parse_special: false },
      { prompt: `<|im_start|>system\nYou answer questions about the corpus.<|im_end|>\n<|im_start|>user\n${QUESTION}` +
                '<|im_end|>\n<|im_start|>assistant\n', parse_special: true },
    ],
  },
};
const S = SETS[set];
if (!S) throw new Error(`--set ${set}: use one of ${Object.keys(SETS).join(', ')}`);
const modelsDir = opt('--models', S.dir);
const outDir = opt('--out', S.out);
const MODELS = S.models;
const PROMPTS = S.prompts;

const { getLlama, LlamaLogLevel } = await import(join(peer, 'node_modules/node-llama-cpp/dist/index.js'));
const info = peerInfo(peer);


// the shortest decimal that reads back as the same float32
const f32 = (x) => {
  const want = Math.fround(x);
  for (let p = 1; p <= 9; p++) {
    const s = want.toPrecision(p);
    if (Math.fround(Number(s)) === want) return Number(s);
  }
  return want;
};

const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
mkdirSync(outDir, { recursive: true });
for (const name of MODELS) {
  if (only && name !== only) continue;
  const file = join(modelsDir, `${name}.gguf`);
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const context = await model.createContext({
    contextSize: 512, batchSize: 512, threads: { ideal: 2, min: 2 }, flashAttention: false,
    experimentalKvCacheKeyType: 'F32', experimentalKvCacheValueType: 'F32', swaFullCache: true });
  const seq = context.getSequence();
  const faContext = await model.createContext({
    contextSize: 512, batchSize: 512, threads: { ideal: 2, min: 2 }, flashAttention: true,
    experimentalKvCacheKeyType: 'F32', experimentalKvCacheValueType: 'F32', swaFullCache: true });
  const faSeq = faContext.getSequence();
  const greedy = { generateNext: { token: true, logits: true, options: { temperature: 0 } } };
  const record = (next, step, pos) => {
    const top = Array.from(next.logits.entries()).slice(0, 11);
    // ties by id ascending, as the engine's argmax
    top.sort((a, b) => b[1] - a[1] || a[0] - b[0]);
    const best = top[0][0];
    return { step, pos, token: best, margin: f32(top[0][1] - top[1][1]),
             top: top.slice(0, 10).map(([id, logit]) => [id, f32(logit)]) };
  };
  const prompts = [];
  for (const p of PROMPTS) {
    await seq.clearHistory();
    const ids = [...(S.bos ? [model.tokens.bos] : []), ...model.tokenize(p.prompt, p.parse_special)];
    const res = await seq.controlledEvaluate(ids.map((t, i) => (i === ids.length - 1 ? [t, greedy] : t)));
    let next = res[ids.length - 1].next;
    const out = [];
    for (let s = 0; s < steps; s++) {
      const rec = record(next, s, ids.length + s);
      out.push(rec);
      if (s + 1 < steps) next = (await seq.controlledEvaluate([[rec.token, greedy]]))[0].next;
    }
    // llama.cpp against itself: the same tokens with the prompt fed one token
    // per call (other kernels and summation orders), the largest difference of
    // the reported logits over every step
    await seq.clearHistory();
    let self = 0, again;
    for (let i = 0; i < ids.length; i++)
      again = (await seq.controlledEvaluate([[ids[i], greedy]]))[0].next;
    for (let s = 0; s < steps; s++) {
      for (const [id, logit] of out[s].top) self = Math.max(self, Math.abs(again.logits.get(id) - logit));
      if (s + 1 < steps) again = (await seq.controlledEvaluate([[out[s].token, greedy]]))[0].next;
    }
    // and with its flash-attention kernel: another attention arithmetic
    const res2 = await faSeq.controlledEvaluate(ids.map((t, i) => (i === ids.length - 1 ? [t, greedy] : t)));
    let fa = 0, flash = res2[ids.length - 1].next;
    for (let s = 0; s < steps; s++) {
      for (const [id, logit] of out[s].top) fa = Math.max(fa, Math.abs(flash.logits.get(id) - logit));
      if (s + 1 < steps) flash = (await faSeq.controlledEvaluate([[out[s].token, greedy]]))[0].next;
    }
    await faSeq.clearHistory();
    prompts.push({ prompt: p.prompt, parse_special: p.parse_special, prompt_token_ids: ids,
                   self_envelope: f32(self), flash_envelope: f32(fa), steps: out });
  }
  const fixture = {
    ...fixtureHead('cartridge-reference/greedy-v1', `tools/greedy_fixtures.mjs --set ${set}`, info, llama),
    model: { ...fileEntry(file), architecture: S.arch || (set === 'gemma4' ? 'gemma4' : 'qwen3'),
             bos_id: model.tokens.bos, made_by: S.madeBy(...name.match(/^(.*)-([a-z0-9_]+?)$/i).slice(1)) },
    settings: { threads: 2, kv_cache_type: 'f32', flash_attention: false, swa_full_cache: true,
                sampling: 'greedy (temperature 0): argmax of the raw logits, ties to the lowest id',
                context_size: 512, n_predict: steps, top_k_reported: 10,
                prompt_processing: 'whole prompt in one batch, then one token per decode call' },
    prompts,
  };
  // one line per step keeps the files small and diffable
  const text = JSON.stringify({ ...fixture, prompts: '@PROMPTS@' }, null, 1).replace('"@PROMPTS@"', '[\n' +
    prompts.map((p) => ' {"prompt": ' + JSON.stringify(p.prompt) + ', "parse_special": ' + p.parse_special +
      ', "self_envelope": ' + p.self_envelope + ', "flash_envelope": ' + p.flash_envelope +
      ',\n  "prompt_token_ids": ' + JSON.stringify(p.prompt_token_ids) + ',\n  "steps": [\n' +
      p.steps.map((s) => '   ' + JSON.stringify(s)).join(',\n') + '\n  ]}').join(',\n') + '\n ]');
  writeFileSync(join(outDir, `${name}.greedy.json`), text + '\n');
  console.log(`${name}: ${prompts.map((p) => p.prompt_token_ids.length).join(', ')} prompt tokens, ${steps} steps each`);
  await faContext.dispose();
  await context.dispose();
  await model.dispose();
}
await llama.dispose();
