// Drives the Strata gateway with the official OpenAI Node client (npm `openai`):
// a streaming chat, a non-streaming completion, and error cases.
// Usage: node openai_client_check.cjs <npm_dir> <base_url> <api_key>
'use strict';
const path = require('path');
const [npmDir, baseURL, apiKey] = process.argv.slice(2);
const mod = require(path.join(npmDir, 'node_modules', 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
}

async function main() {
  const client = new OpenAI({baseURL, apiKey, maxRetries: 0, timeout: 30000});

  // Streaming chat.
  const stream = await client.chat.completions.create({
    model: 'strata-test',
    messages: [{role: 'user', content: 'Say something.'}],
    stream: true,
    stream_options: {include_usage: true},
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) text += choice.delta.content || '';
  }
  check(text === 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ', 'streamed text: ' + text);
  check(usage && usage.completion_tokens === 8, 'stream usage');
  check(typeof usage.prompt_tokens_details.cached_tokens === 'number', 'cached_tokens');

  // Non-streaming completion.
  const completion = await client.completions.create(
      {model: 'strata-test', prompt: 'Once upon a time', max_tokens: 2});
  check(completion.choices[0].text === 'tok0 tok1 ', 'completion text');
  check(completion.choices[0].finish_reason === 'length', 'finish_reason');

  // Errors: unknown model (404), rejection (429 with Retry-After), bad key (401).
  let status = 0;
  try {
    await client.chat.completions.create(
        {model: 'no-such-model', messages: [{role: 'user', content: 'x'}]});
  } catch (e) {
    status = e.status;
    check(e.error && e.error.code === 'model_not_found', 'error code ' + JSON.stringify(e.error));
  }
  check(status === 404, 'unknown model status ' + status);
  status = 0;
  try {
    await client.chat.completions.create(
        {model: 'strata-test', messages: [{role: 'user', content: 'REJECT'}]});
  } catch (e) {
    status = e.status;
    check(e.headers && e.headers['retry-after'] === '7', 'retry-after header');
  }
  check(status === 429, 'rejection status ' + status);
  const badClient = new OpenAI({baseURL, apiKey: 'sk-wrong', maxRetries: 0});
  status = 0;
  try {
    await badClient.models.list();
  } catch (e) {
    status = e.status;
  }
  check(status === 401, 'bad key status ' + status);
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'strata-test', 'models');
  console.log('openai client checks passed');
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
