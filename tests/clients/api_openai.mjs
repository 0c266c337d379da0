// The official `openai` client against `deltaserve serve` on a tiny model: chat (streaming and not,
// usage with cached tokens), a tool-call round trip, completions, the Responses API (Codex style
// input items, hosted tool types, streaming through the SDK's strict accumulator) and error shapes.
// The model has random weights, so the checks are about protocol and consistency, not wording; the
// content of tool calls is covered by the C++ tests with a scripted engine.
import OpenAI from 'openai';
import { withServer, check } from './server_harness.mjs';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

function checkUsage(u, where) {
  check(u && Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, `${where}: prompt_tokens`);
  check(Number.isInteger(u.completion_tokens) && u.completion_tokens > 0, `${where}: completion_tokens`);
  check(u.total_tokens === u.prompt_tokens + u.completion_tokens, `${where}: total_tokens`);
  const cached = u.prompt_tokens_details?.cached_tokens;
  check(Number.isInteger(cached) && cached >= 0 && cached <= u.prompt_tokens, `${where}: cached_tokens ${cached}`);
}

await withServer('api_openai', [], async (server) => {
  const client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });

  const models = await client.models.list();
  const model = models.data[0].id;
  check(typeof model === 'string' && model.length > 0, 'models.list returns the served model');

  // Non-streaming chat, twice: greedy output is deterministic, the second run may reuse the prefix.
  const req = {
    model,
    messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello.' }],
    temperature: 0,
    max_tokens: 12,
  };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  check(a.object === 'chat.completion', 'object');
  check(a.choices[0].message.role === 'assistant', 'role');
  check(['stop', 'length'].includes(a.choices[0].finish_reason), `finish_reason ${a.choices[0].finish_reason}`);
  checkUsage(a.usage, 'chat');
  checkUsage(b.usage, 'chat repeat');
  check(a.choices[0].message.content === b.choices[0].message.content, 'greedy content repeats');
  check(a.choices[0].message.reasoning_content === b.choices[0].message.reasoning_content, 'greedy reasoning repeats');
  console.log(`chat usage: first ${JSON.stringify(a.usage)}, repeat ${JSON.stringify(b.usage)}`);

  // Streaming gives the same text as non-streaming, and a usage chunk when asked.
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.content) content += choice.delta.content;
    if (choice.delta.reasoning_content) reasoning += choice.delta.reasoning_content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  check(chunks >= 2, 'stream has chunks');
  check(content === (a.choices[0].message.content ?? ''), `streamed content equals non-streamed: ${JSON.stringify(content)}`);
  check(reasoning === (a.choices[0].message.reasoning_content ?? ''), 'streamed reasoning equals non-streamed');
  check(finish === a.choices[0].finish_reason, 'stream finish_reason');
  checkUsage(usage, 'stream usage');

  // Tool-call round trip: tools offered, then the call and its result sent back as history.
  const t1 = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, max_tokens: 8, temperature: 0 });
  check(t1.choices[0].message.role === 'assistant', 'tool request answered');
  const t2 = await client.chat.completions.create({
    model,
    tools,
    max_tokens: 8,
    temperature: 0,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
    ],
  });
  checkUsage(t2.usage, 'tool round trip');
  check(t2.usage.prompt_tokens > t1.usage.prompt_tokens, 'history with the tool result is longer');
  const forced = await client.chat.completions.create({
    model, tools, max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: 'Weather?' }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  check(forced.choices.length === 1, 'named tool_choice accepted');

  // Legacy completions.
  const comp = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  check(typeof comp.choices[0].text === 'string', 'completion text');
  check(comp.usage.completion_tokens > 0 && comp.usage.completion_tokens <= 6, 'completion max_tokens');

  // Responses API, the way Codex calls it.
  const r = await client.responses.create({
    model,
    instructions: 'You are a coding agent.',
    input: [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'List files.' }] }],
    tools: [{ type: 'function', name: 'shell', parameters: { type: 'object', properties: { cmd: { type: 'string' } } } },
            { type: 'web_search' }],
    max_output_tokens: 12,
    temperature: 0,
    store: false,
  });
  check(r.object === 'response', 'response object');
  check(['completed', 'incomplete'].includes(r.status), `response status ${r.status}`);
  check(Number.isInteger(r.usage.input_tokens_details.cached_tokens), 'responses cached_tokens');
  const r2 = await client.responses.create({
    model,
    input: [
      { type: 'message', role: 'user', content: 'Run ls.' },
      { type: 'function_call', call_id: 'call_9', name: 'shell', arguments: '{"cmd":"ls"}' },
      { type: 'function_call_output', call_id: 'call_9', output: 'a.txt\nb.txt' },
    ],
    tools: [{ type: 'function', name: 'shell', parameters: { type: 'object', properties: { cmd: { type: 'string' } } } }],
    max_output_tokens: 8,
  });
  check(r2.output.length >= 1, 'function_call items accepted');

  const events = [];
  const rs = await client.responses.create({ model, input: 'Hi', max_output_tokens: 10, temperature: 0, stream: true });
  for await (const e of rs) events.push(e.type);
  check(events[0] === 'response.created', `first event ${events[0]}`);
  check(['response.completed', 'response.incomplete'].includes(events.at(-1)), `last event ${events.at(-1)}`);
  const helper = client.responses.stream({ model, input: 'Hi', max_output_tokens: 10, temperature: 0 });
  const final = await helper.finalResponse();
  check(final.id.startsWith('resp_'), 'SDK accumulator accepts the event stream');

  // Errors the SDK maps to typed exceptions.
  let status = 0;
  try {
    await client.chat.completions.create({ ...req, model: 'no-such-model' });
  } catch (e) {
    status = e.status;
  }
  check(status === 404, `unknown model -> 404, got ${status}`);
  status = 0;
  try {
    await client.responses.create({ model, input: 'x', previous_response_id: 'resp_abc' });
  } catch (e) {
    status = e.status;
  }
  check(status === 400, `previous_response_id -> 400, got ${status}`);
});
