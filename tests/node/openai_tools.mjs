// Tool calls through a cartridge server with the official openai client;
// tests/lua/structured_spec.lua runs it and checks what it prints (one JSON
// line).
//   CARTRIDGE_URL=http://127.0.0.1:PORT/v1 CARTRIDGE_MODEL=name node openai_tools.mjs
//
// One conversation, as an application that uses tools runs it:
// 1. chat.completions.create with `tools` and a named tool_choice: the
//    client gets message.tool_calls and finish_reason "tool_calls"; the
//    arguments parse and ajv accepts them under the tool's parameters;
// 2. the same request streamed through the SDK's stream helper
//    (chat.completions.stream), which assembles the tool_calls deltas
//    and parses the arguments itself; the assembled call must equal the
//    unstreamed one (same seed);
// 3. the assistant's call and a tool result sent back with tool_choice
//    "auto": the model answers (content, or another call);
// 4. the SDK's runTools loop with a JavaScript function: the client calls
//    it with the model's arguments;
// 5. the Responses API with the same tool: a function_call output item, and
//    its function_call_output sent back as input items.
import OpenAI from "openai";
import { parameters, validate, checkInput } from "./weather_tool.mjs";

const client = new OpenAI({ baseURL: process.env.CARTRIDGE_URL, apiKey: "unused", maxRetries: 0 });
// the parse, stream and runTools helpers: on chat.completions from openai 5 on (Node 20+), under beta before
const helpers = typeof client.chat.completions.parse === "function" ? client.chat.completions : client.beta.chat.completions;
const model = process.env.CARTRIDGE_MODEL;
const tools = [{
  type: "function",
  function: { name: "get_weather", description: "The weather in a city now", parameters, strict: true },
}];
const forced = { type: "function", function: { name: "get_weather" } };
const messages = [{ role: "user", content: "What is the weather in Paris?" }];
const base = { model, messages, tools, tool_choice: forced, max_tokens: 400, temperature: 1, seed: 7 };

// What a call's arguments are: parsed and checked, or why not.
function checkArgs(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return { error: `not JSON (${e.message}): ${text}` };
  }
  const check = checkInput(doc);
  return check.error ? check : { doc };
}

const out = {};

// 1. a forced call
const first = await client.chat.completions.create(base);
const call = first.choices[0].message.tool_calls?.[0];
out.plain = {
  finish: first.choices[0].finish_reason,
  content: first.choices[0].message.content,
  calls: first.choices[0].message.tool_calls?.length ?? 0,
  id: call?.id, type: call?.type, name: call?.function?.name, arguments: call?.function?.arguments,
  check: call ? checkArgs(call.function.arguments) : { error: "no tool call" },
};

// 2. streamed, assembled by the SDK
const runner = helpers.stream({ ...base, stream: true });
let argumentDeltas = 0;
const doneEvents = [];
runner.on("tool_calls.function.arguments.delta", () => { argumentDeltas += 1; });
runner.on("tool_calls.function.arguments.done", (ev) => { doneEvents.push(ev.name); });
const streamed = await runner.finalChatCompletion();
const scall = streamed.choices[0].message.tool_calls?.[0];
out.streamed = {
  finish: streamed.choices[0].finish_reason,
  name: scall?.function?.name, arguments: scall?.function?.arguments,
  argument_deltas: argumentDeltas, done_events: doneEvents,
};

// 3. the tool's result back to the model
const followUp = await client.chat.completions.create({
  model, tools, tool_choice: "auto", max_tokens: 24, temperature: 0,
  messages: [...messages, first.choices[0].message,
    { role: "tool", tool_call_id: call?.id ?? "call_missing", content: "18 degrees celsius and sunny" }],
});
out.follow_up = {
  finish: followUp.choices[0].finish_reason,
  content_type: typeof followUp.choices[0].message.content,
  calls: followUp.choices[0].message.tool_calls?.length ?? 0,
  prompt_tokens: followUp.usage.prompt_tokens,
  first_prompt_tokens: first.usage.prompt_tokens,
};

// 4. the SDK's own tool loop
const called = [];
const loop = helpers.runTools({
  model, messages, max_tokens: 400, temperature: 1, seed: 7, tool_choice: forced,
  tools: [{
    type: "function",
    function: {
      name: "get_weather", parameters, parse: JSON.parse,
      function: (args) => { called.push(args); return "18 degrees celsius and sunny"; },
    },
  }],
});
await loop.done();
out.run_tools = { called: called.length, args_valid: called.length > 0 && called.every((a) => validate(a)) };

// 5. Responses
const rtools = [{ type: "function", name: "get_weather", description: "The weather in a city now", parameters,
  strict: true }];
const resp = await client.responses.create({
  model, input: messages[0].content, tools: rtools, tool_choice: { type: "function", name: "get_weather" },
  max_output_tokens: 400, temperature: 1,
});
const item = resp.output.find((o) => o.type === "function_call");
out.responses = {
  status: resp.status, item_type: item?.type, name: item?.name, call_id: item?.call_id,
  check: item ? checkArgs(item.arguments) : { error: "no function_call item" },
};
const resp2 = await client.responses.create({
  model, tools: rtools, max_output_tokens: 16, temperature: 0,
  input: [{ role: "user", content: messages[0].content }, item,
    { type: "function_call_output", call_id: item?.call_id, output: "18 degrees celsius and sunny" }],
});
out.responses.follow_up_status = resp2.status;
out.responses.follow_up_types = resp2.output.map((o) => o.type);

console.log(JSON.stringify(out));
