// Calls a cartridge server with the official Anthropic client (Messages API),
// non-streaming and streaming, and prints what came back as one JSON line.
//   CARTRIDGE_URL=http://127.0.0.1:PORT CARTRIDGE_MODEL=name node anthropic_client.mjs
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({
  baseURL: process.env.CARTRIDGE_URL,
  apiKey: process.env.CARTRIDGE_KEY || "unused",
  maxRetries: 0,
});
const model = process.env.CARTRIDGE_MODEL;
const messages = [{ role: "user", content: process.env.CARTRIDGE_QUESTION || "Lily" }];

const plain = await client.messages.create({ model, messages, max_tokens: 16, temperature: 0 });
const events = [];
let streamed = "";
const stream = await client.messages.create({ model, messages, max_tokens: 16, temperature: 0, stream: true });
for await (const ev of stream) {
  events.push(ev.type);
  if (ev.type === "content_block_delta") streamed += ev.delta.text;
}
// the SDK's helper that assembles the final message from the events
const helper = await client.messages.stream({ model, messages, max_tokens: 16, temperature: 0 }).finalMessage();
let notFound = null;
try {
  await client.messages.create({ model: "no-such-cartridge", messages, max_tokens: 4 });
} catch (e) {
  notFound = { status: e.status, type: e.error?.error?.type };
}
console.log(JSON.stringify({
  text: plain.content[0].text,
  stop_reason: plain.stop_reason,
  usage: plain.usage,
  streamed,
  events: [...new Set(events)],
  helper_text: helper.content[0].text,
  helper_stop: helper.stop_reason,
  helper_usage: helper.usage,
  not_found: notFound,
}));
