// The official `@anthropic-ai/sdk` client against `deltaserve serve` on a tiny model, with an API key
// and a model alias as Claude Code would be configured: messages (streaming and not), thinking
// blocks, a tool_use / tool_result round trip, usage with cache_read_input_tokens, error types.
import Anthropic from '@anthropic-ai/sdk';
import { withServer, check } from './server_harness.mjs';

const KEY = 'test-key-123';
const MODEL = 'claude-test-alias';

function checkUsage(u, where) {
  check(u && Number.isInteger(u.input_tokens) && u.input_tokens >= 0, `${where}: input_tokens`);
  check(Number.isInteger(u.output_tokens) && u.output_tokens > 0, `${where}: output_tokens`);
  check(Number.isInteger(u.cache_read_input_tokens) && u.cache_read_input_tokens >= 0, `${where}: cache_read_input_tokens`);
  check(u.input_tokens + u.cache_read_input_tokens > 0, `${where}: prompt counted`);
}

await withServer('api_anthropic', ['--api-key', KEY, '--model-alias', MODEL], async (server) => {
  const client = new Anthropic({ baseURL: server.baseURL, apiKey: KEY, maxRetries: 0 });
  const tools = [{ name: 'read_file', description: 'Read a file', input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } }];

  const req = {
    model: MODEL,
    max_tokens: 12,
    temperature: 0,
    system: [{ type: 'text', text: 'You are a coding agent.' }],
    messages: [{ role: 'user', content: 'Hello' }],
  };
  const m = await client.messages.create(req);
  check(m.type === 'message' && m.role === 'assistant', 'message shape');
  check(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  check(Array.isArray(m.content), 'content blocks');
  checkUsage(m.usage, 'messages');

  // Streaming through the SDK helper, which checks the event order while it accumulates.
  const stream = client.messages.stream(req);
  const seen = new Set();
  stream.on('streamEvent', (e) => seen.add(e.type));
  const final = await stream.finalMessage();
  for (const t of ['message_start', 'message_delta', 'message_stop']) check(seen.has(t), `stream has ${t}`);
  check(final.stop_reason === m.stop_reason, 'streamed stop_reason equals non-streamed');
  const text = (msg) => msg.content.map((b) => (b.type === 'text' ? b.text : b.type === 'thinking' ? `<t>${b.thinking}` : '')).join('|');
  check(text(final) === text(m), `streamed blocks equal non-streamed: ${JSON.stringify(text(final))} vs ${JSON.stringify(text(m))}`);
  checkUsage(final.usage, 'stream');

  // Thinking disabled: no thinking blocks.
  const plain = await client.messages.create({ ...req, thinking: { type: 'disabled' } });
  check(plain.content.every((b) => b.type !== 'thinking'), 'no thinking blocks when disabled');

  // Tool round trip as history.
  const t = await client.messages.create({
    model: MODEL,
    max_tokens: 8,
    tools,
    messages: [
      { role: 'user', content: 'Show a.txt' },
      { role: 'assistant', content: [{ type: 'text', text: 'Reading.' }, { type: 'tool_use', id: 'toolu_01', name: 'read_file', input: { path: 'a.txt' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'hello world' }] },
    ],
  });
  checkUsage(t.usage, 'tool round trip');
  const forced = await client.messages.create({ ...req, tools, tool_choice: { type: 'tool', name: 'read_file' } });
  check(forced.role === 'assistant', 'tool_choice tool accepted');

  // Error types.
  const bad = new Anthropic({ baseURL: server.baseURL, apiKey: 'wrong', maxRetries: 0 });
  let err = null;
  try { await bad.messages.create(req); } catch (e) { err = e; }
  check(err instanceof Anthropic.AuthenticationError, `wrong key -> AuthenticationError, got ${err}`);
  err = null;
  try { await client.messages.create({ ...req, model: 'claude-unknown' }); } catch (e) { err = e; }
  check(err instanceof Anthropic.NotFoundError, `unknown model -> NotFoundError, got ${err}`);
  err = null;
  try { await client.messages.create({ ...req, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }); } catch (e) { err = e; }
  check(err instanceof Anthropic.BadRequestError, `image block -> BadRequestError, got ${err}`);
});
