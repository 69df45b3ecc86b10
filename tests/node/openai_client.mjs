// Calls a cartridge server with the official `openai` client, non-streaming
// and streaming, and prints what came back as one JSON line for the spec.
//   CARTRIDGE_URL=http://127.0.0.1:PORT/v1 CARTRIDGE_MODEL=name node openai_client.mjs
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.CARTRIDGE_URL,
  apiKey: process.env.CARTRIDGE_KEY || "unused",
  maxRetries: 0,
});
const model = process.env.CARTRIDGE_MODEL;
const messages = [{ role: "user", content: process.env.CARTRIDGE_QUESTION || "Lily" }];

const plain = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
let streamed = "";
let finish = null;
let usage = null;
let chunks = 0;
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const choice of chunk.choices) {
    streamed += choice.delta?.content ?? "";
    if (choice.finish_reason) finish = choice.finish_reason;
  }
}
const models = await client.models.list();
let notFound = null;
try {
  await client.chat.completions.create({ model: "no-such-cartridge", messages, max_tokens: 4 });
} catch (e) {
  notFound = e.status;
}
// the Responses API: plain, streamed, and the SDK's output_text
const resp = await client.responses.create({ model, input: messages[0].content, max_output_tokens: 16, temperature: 0 });
let respStreamed = "";
const respEvents = [];
let respFinal = null;
const respStream = await client.responses.create({
  model, input: [{ role: "user", content: [{ type: "input_text", text: messages[0].content }] }],
  max_output_tokens: 16, temperature: 0, stream: true,
});
for await (const ev of respStream) {
  respEvents.push(ev.type);
  if (ev.type === "response.output_text.delta") respStreamed += ev.delta;
  if (ev.type === "response.completed" || ev.type === "response.incomplete") respFinal = ev.response;
}
// log-probabilities, streamed too, a logit bias, and a completion with logprobs and one with echo
const lp = await client.chat.completions.create({
  model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2, logit_bias: { "0": -100 },
});
let lpStreamed = 0;
const lpStream = await client.chat.completions.create({
  model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2, stream: true,
});
for await (const chunk of lpStream) lpStreamed += chunk.choices[0]?.logprobs?.content?.length ?? 0;
const comp = await client.completions.create({ model, prompt: "Once upon", max_tokens: 4, temperature: 0, logprobs: 2 });
const echo = await client.completions.create({ model, prompt: "Once upon", max_tokens: 4, temperature: 0, echo: true });
// n = 2: two choices in one answer, and streamed
const two = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2, seed: 3, temperature: 1 });
const twoStreamed = ["", ""];
const twoStream = await client.chat.completions.create({
  model, messages, max_tokens: 4, n: 2, seed: 3, temperature: 1, stream: true,
});
for await (const chunk of twoStream) for (const c of chunk.choices) twoStreamed[c.index] += c.delta?.content ?? "";
// embeddings: the client asks for base64 by default and decodes it; the float form must agree
const embB64 = await client.embeddings.create({ model: "llama", input: ["Lily", "Tom"] });
const embFloat = await client.embeddings.create({ model: "llama", input: ["Lily", "Tom"], encoding_format: "float" });
console.log(JSON.stringify({
  two: { texts: two.choices.map((c) => c.message.content), indexes: two.choices.map((c) => c.index), streamed: twoStreamed },
  embeddings: {
    n: embB64.data.length, dim: embB64.data[0].embedding.length,
    same: embB64.data.every((d, i) => d.embedding.every((x, k) => x === embFloat.data[i].embedding[k])),
    norm: Math.hypot(...embFloat.data[0].embedding),
  },
  logprobs: {
    content: lp.choices[0].logprobs.content.map((e) => ({ token: e.token, logprob: e.logprob, top: e.top_logprobs.length })),
    text: lp.choices[0].message.content,
    streamed: lpStreamed,
    completion: { tokens: comp.choices[0].logprobs.tokens, token_logprobs: comp.choices[0].logprobs.token_logprobs,
      text: comp.choices[0].text },
    echo: echo.choices[0].text, echo_of: comp.choices[0].text,
  },
  responses: {
    text: resp.output_text, status: resp.status, usage: resp.usage, streamed: respStreamed,
    events: [...new Set(respEvents)], final_status: respFinal?.status, final_text: respFinal?.output?.[0]?.content?.[0]?.text,
  },
  text: plain.choices[0].message.content,
  finish: plain.choices[0].finish_reason,
  usage: plain.usage,
  streamed, stream_finish: finish, stream_usage: usage, chunks,
  models: models.data.map((m) => m.id),
  not_found: notFound,
}));
