// The weather tool the tool-use client scripts (openai_tools.mjs,
// anthropic_tools.mjs) declare, and ajv's check of what the model passes it.
import Ajv2020 from "ajv/dist/2020.js";

export const parameters = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 24 },
    unit: { type: "string", enum: ["celsius", "fahrenheit"] },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};

const ajv = new Ajv2020({ strict: false, allErrors: true });
export const validate = ajv.compile(parameters);

// An arguments object checked against the parameters: {} or { error }.
export function checkInput(doc) {
  return validate(doc) ? {} : { error: `${ajv.errorsText(validate.errors)}: ${JSON.stringify(doc)}` };
}
