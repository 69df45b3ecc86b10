// Structured output through a cartridge server; tests/lua/structured_spec.lua
// runs it and checks what it prints (one JSON line).
//   CARTRIDGE_URL=http://127.0.0.1:PORT/v1 CARTRIDGE_MODEL=name CARTRIDGE_CASES=cases.json node structured.mjs
// cases.json: {"runs": 50, "parallel": 4, "cases": [{"name", "schema", "max_tokens"}],
//              "tools": [...], "tool_max_tokens": N, "object_runs": N, "object_max_tokens": N}
//
// 1. The official openai client: chat.completions.parse and
//    responses.parse with a json_schema, the parsed object validated by ajv.
// 2. `runs` chat completions per schema case at temperature 1 (seeds
//    1..runs), and as many forced tool calls: every output that finished is
//    parsed and validated by ajv against its schema (the tool's parameters
//    for calls); those max_tokens cut come back for the spec.
// 3. response_format json_object: every output that finished is a JSON
//    object (the texts come back for the spec to check the others).
// 4. Bad input: each new field with a wrong type or an invalid schema is a
//    400 naming the field, and the server answers /health after each.
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import Ajv2020 from "ajv/dist/2020.js";

const base = process.env.CARTRIDGE_URL;
const spec = JSON.parse(readFileSync(process.env.CARTRIDGE_CASES, "utf8"));
const client = new OpenAI({ baseURL: base, apiKey: "unused", maxRetries: 0 });
// the parse, stream and runTools helpers: on chat.completions from openai 5 on (Node 20+), under beta before
const helpers = typeof client.chat.completions.parse === "function" ? client.chat.completions : client.beta.chat.completions;
const ajv = new Ajv2020({ strict: false, allErrors: true });
const model = process.env.CARTRIDGE_MODEL;
const messages = [{ role: "user", content: "Describe one thing as JSON." }];

// Runs jobs (functions returning promises) with at most n in flight.
async function pool(jobs, n) {
  const out = new Array(jobs.length);
  let next = 0;
  async function worker() {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  }
  await Promise.all(Array.from({ length: n }, worker));
  return out;
}

// Whether text is a JSON document the validator accepts; the reason when not.
function check(validate, text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return `not JSON (${e.message}): ${text}`;
  }
  if (!validate(doc)) return `${ajv.errorsText(validate.errors)}: ${text}`;
  return null;
}

const result = { parse: {}, cases: [], tools: {}, json_object: {}, bad: [] };

// 1. the client's parse helpers
{
  const c = spec.cases[0];
  const validate = ajv.compile(c.schema);
  const completion = await helpers.parse({
    model, messages, max_tokens: c.max_tokens, temperature: 1, seed: 7,
    response_format: { type: "json_schema", json_schema: { name: c.name, schema: c.schema, strict: true } },
  });
  const parsed = completion.choices[0].message.parsed;
  result.parse.chat = { finish: completion.choices[0].finish_reason, valid: validate(parsed), parsed };
  const response = await client.responses.parse({
    model, input: messages[0].content, max_output_tokens: c.max_tokens, temperature: 1,
    text: { format: { type: "json_schema", name: c.name, schema: c.schema, strict: true } },
  });
  result.parse.responses = { status: response.status, valid: validate(response.output_parsed),
    parsed: response.output_parsed, format: response.text?.format?.type };
}

// 2. random completions per schema case, and forced tool calls
for (const c of spec.cases) {
  const validate = ajv.compile(c.schema);
  const started = Date.now();
  const outs = await pool(Array.from({ length: spec.runs }, (_, i) => async () => {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: c.max_tokens, temperature: 1, seed: i + 1,
      response_format: { type: "json_schema", json_schema: { name: c.name, schema: c.schema, strict: true } },
    });
    const choice = r.choices[0];
    // a document cut by max_tokens cannot be valid: the spec checks it is a prefix of one
    const cut = choice.finish_reason === "length";
    return { finish: choice.finish_reason, tokens: r.usage.completion_tokens, cut: cut ? choice.message.content : null,
      error: cut ? null : check(validate, choice.message.content) };
  }), spec.parallel);
  const errors = outs.filter((o) => o.error).map((o) => o.error);
  const stopped = outs.filter((o) => o.finish === "stop").length;
  result.cases.push({ name: c.name, runs: outs.length, stopped, valid: stopped - errors.length, errors: errors.slice(0, 3),
    cut: outs.filter((o) => o.cut !== null).map((o) => o.cut),
    max_tokens_used: Math.max(...outs.map((o) => o.tokens)), seconds: (Date.now() - started) / 1000 });
}
{
  const byName = Object.fromEntries(spec.tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  const outs = await pool(Array.from({ length: spec.runs }, (_, i) => async () => {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: spec.tool_max_tokens, temperature: 1, seed: i + 1, tools: spec.tools,
      tool_choice: i % 2 ? "required" : { type: "function", function: { name: spec.tools[0].function.name } },
    });
    const choice = r.choices[0];
    const call = choice.message.tool_calls?.[0];
    if (!call) return { error: `no call (${choice.finish_reason}): ${choice.message.content}` };
    const validate = byName[call.function.name];
    if (!validate) return { error: `unknown tool ${call.function.name}` };
    if (i % 2 === 0 && call.function.name !== spec.tools[0].function.name) return { error: "not the named tool" };
    return { finish: choice.finish_reason, name: call.function.name, error: check(validate, call.function.arguments) };
  }), spec.parallel);
  const errors = outs.filter((o) => o.error).map((o) => o.error);
  result.tools = { runs: outs.length, valid: outs.length - errors.length, errors: errors.slice(0, 3),
    finish: [...new Set(outs.map((o) => o.finish))], names: [...new Set(outs.map((o) => o.name))] };
}

// 3. json_object
{
  const outs = await pool(Array.from({ length: spec.object_runs }, (_, i) => async () => {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: spec.object_max_tokens, temperature: 1, seed: i + 1,
      response_format: { type: "json_object" },
    });
    return { finish: r.choices[0].finish_reason, text: r.choices[0].message.content };
  }), spec.parallel);
  const stopped = outs.filter((o) => o.finish === "stop");
  const isObject = ajv.compile({ type: "object" });
  const errors = stopped.map((o) => check(isObject, o.text)).filter((e) => e);
  result.json_object = { runs: outs.length, stopped: stopped.length, errors: errors.slice(0, 3), texts: outs.map((o) => o.text),
    valid: stopped.length - errors.length,
    all_start_with_brace: outs.every((o) => o.text.startsWith("{")) };
}

// 4. bad input, raw over HTTP: each a 400 naming the field; the server keeps answering
const schemaOk = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] };
const js = (over) => ({ type: "json_schema", json_schema: { name: "x", schema: schemaOk, ...over } });
const chat = (rf) => ({ path: "/chat/completions", body: { model, messages, max_tokens: 8, response_format: rf } });
const resp = (text) => ({ path: "/responses", body: { model, input: "x", max_output_tokens: 8, text } });
const badCases = [
  [chat("json"), "response_format"],
  [chat(5), "response_format"],
  [chat({ type: "yaml" }), "response_format"],
  [chat({ type: 7 }), "response_format"],
  [chat({ type: "json_schema" }), "response_format"],
  [chat({ type: "json_schema", json_schema: "x" }), "response_format"],
  [chat(js({ name: 5 })), "response_format"],
  [chat(js({ name: "has space" })), "response_format"],
  [chat(js({ schema: "nope" })), "response_format"],
  [chat(js({ schema: null })), "response_format"],
  [chat(js({ strict: "yes" })), "response_format"],
  [chat(js({ description: 3 })), "response_format"],
  [chat(js({ strict: true, schema: { type: "string", pattern: "^a" } })), "response_format", "'pattern'"],
  [chat(js({ schema: { type: "integer", minimum: 5, maximum: 1 } })), "response_format", "no integer"],
  [chat(js({ schema: { type: "objekt" } })), "response_format", "objekt"],
  [chat(js({ schema: { $ref: "#/$defs/nope" } })), "response_format", "points to nothing"],
  [chat(js({ schema: { type: "object", properties: { n: { $ref: "#" } }, required: ["n"] } })), "response_format",
    "no finite JSON value"],
  [resp(5), "text"],
  [resp({ format: "json" }), "text"],
  [resp({ format: { type: "xml" } }), "text"],
  [resp({ format: { type: "json_schema", schema: schemaOk } }), "text", "name"],
  [resp({ format: { type: "json_schema", name: "x", schema: [] } }), "text"],
  [resp({ format: { type: "json_schema", name: "x", strict: true, schema: { type: "string", format: "uri" } } }),
    "text", "'format'"],
  [{ path: "/chat/completions", body: { messages, max_tokens: 8, tool_choice: "required", tools: [{ type: "function",
    function: { name: "f", strict: true, parameters: { type: "object", properties: { x: { type: "string",
      format: "email" } } } } }] } }, "tools", "'format'"],
  [{ path: "/chat/completions", body: { messages, max_tokens: 8, tool_choice: "required", tools: [{ type: "function",
    function: { name: "f", parameters: { type: "object", properties: { x: { type: "integer", minimum: "0" } } } } }] } },
    "tools", "minimum must be a number"],
];
for (const [req, param, mention] of badCases) {
  const r = await fetch(base + req.path, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify(req.body) });
  const body = await r.json().catch(() => null);
  const health = await fetch(base.replace(/\/v1$/, "") + "/health");
  result.bad.push({ status: r.status, param: body?.error?.param, message: body?.error?.message, want_param: param,
    mentions: mention ? (body?.error?.message || "").includes(mention) : true, health: health.status });
}
// and a good request after all of them
{
  const r = await client.chat.completions.create({ model, messages, max_tokens: 200, temperature: 0,
    response_format: js({}) });
  result.after_bad = { finish: r.choices[0].finish_reason, content: r.choices[0].message.content };
}
console.log(JSON.stringify(result));
