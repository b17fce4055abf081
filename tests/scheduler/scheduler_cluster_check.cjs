// Drives a real Strata cluster (scheduler + workers) with the official OpenAI Node client:
// a streaming chat, a non-streaming completion and the model list.
// Usage: node scheduler_cluster_check.cjs <npm_dir> <base_url> <model>
'use strict';
const path = require('path');
const [npmDir, baseURL, model] = process.argv.slice(2);
const mod = require(path.join(npmDir, 'node_modules', 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
}

async function main() {
  const client = new OpenAI({baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000});

  const stream = await client.chat.completions.create({
    model,
    messages: [{role: 'user', content: 'Tell me a story about a scheduler.'}],
    max_tokens: 8,
    stream: true,
    stream_options: {include_usage: true},
  });
  let text = '';
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) text += choice.delta.content || '';
  }
  check(text.length > 0, 'streamed text is empty');
  check(usage && usage.completion_tokens > 0 && usage.completion_tokens <= 8,
        'stream usage ' + JSON.stringify(usage));
  check(usage.prompt_tokens > 0, 'prompt tokens');

  const completion = await client.completions.create(
      {model, prompt: 'Once upon a time', max_tokens: 4});
  check(completion.choices[0].text.length > 0, 'completion text is empty');
  check(['length', 'stop'].includes(completion.choices[0].finish_reason), 'finish_reason');
  check(completion.usage.completion_tokens > 0, 'completion usage');

  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model,
        'models ' + JSON.stringify(models.data));
  console.log('cluster client checks passed');
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
