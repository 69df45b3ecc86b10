// Tool use through a cartridge server with the official Anthropic client
// (Messages API); tests/lua/structured_spec.lua runs it and checks what it
// prints (one JSON line).
//   CARTRIDGE_URL=http://127.0.0.1:PORT CARTRIDGE_MODEL=name node anthropic_tools.mjs
//
// One conversation, as an application that uses tools runs it:
// 1. messages.create with `tools` and tool_choice {"type": "tool"}: the
//    client gets a tool_use block and stop_reason "tool_use"; ajv accepts
//    its input under the tool's input_schema;
// 2. the same request through the SDK's stream helper (messages.stream),
//    which assembles the tool_use block from input_json_delta events; the
//    assembled input must equal the unstreamed one (Messages requests are
//    sampled with seed 0);
// 3. the assistant's tool_use and a tool_result sent back with tool_choice
//    auto: the model answers, from a longer prompt;
// 4. tool_choice {"type": "any"}: a call to one of the tools;
// 5. a server tool the server does not run: a 400 in Anthropic's shape.
import Anthropic from "@anthropic-ai/sdk";
import { parameters, checkInput } from "./weather_tool.mjs";

const client = new Anthropic({ baseURL: process.env.CARTRIDGE_URL, apiKey: "unused", maxRetries: 0 });
const model = process.env.CARTRIDGE_MODEL;

const tools = [{ name: "get_weather", description: "The weather in a city now", input_schema: parameters }];
const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const base = { model, messages, tools, tool_choice: { type: "tool", name: "get_weather" }, max_tokens: 400,
  temperature: 1 };

const out = {};

// 1. a forced call
const first = await client.messages.create(base);
const use = first.content.find((b) => b.type === "tool_use");
out.plain = { stop_reason: first.stop_reason, types: first.content.map((b) => b.type), id: use?.id, name: use?.name,
  input: use?.input, check: use ? checkInput(use.input) : { error: "no tool_use block" }, input_tokens: first.usage.input_tokens
    + first.usage.cache_read_input_tokens };

// 2. streamed, assembled by the SDK
const stream = client.messages.stream(base);
let jsonDeltas = 0;
stream.on("inputJson", () => { jsonDeltas += 1; });
const final = await stream.finalMessage();
const streamedUse = final.content.find((b) => b.type === "tool_use");
out.streamed = { stop_reason: final.stop_reason, types: final.content.map((b) => b.type), name: streamedUse?.name,
  input: streamedUse?.input, json_deltas: jsonDeltas };

// 3. the result goes back
const follow = await client.messages.create({ model, tools, max_tokens: 24, temperature: 1, messages: [
  ...messages,
  { role: "assistant", content: first.content },
  { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "18 C and sunny" }] },
] });
out.follow_up = { stop_reason: follow.stop_reason, types: follow.content.map((b) => b.type),
  input_tokens: follow.usage.input_tokens + follow.usage.cache_read_input_tokens };

// 4. any tool
const any = await client.messages.create({ ...base, tool_choice: { type: "any" } });
out.any = { stop_reason: any.stop_reason, name: any.content.find((b) => b.type === "tool_use")?.name };

// 5. a server tool
try {
  await client.messages.create({ ...base, tools: [{ type: "web_search_20250305", name: "web_search" }],
    tool_choice: { type: "auto" } });
  out.server_tool = { status: 200 };
} catch (e) {
  out.server_tool = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message };
}

console.log(JSON.stringify(out));
