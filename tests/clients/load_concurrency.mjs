// Load: 32 concurrent clients for ~20 s against `deltaserve serve --max-queue 8` on a tiny model.
// Every request must be answered 200 or rejected 503 (with Retry-After and a JSON error); greedy
// requests must give, under load, exactly the answer each prompt gets when sent alone (no state mixed
// between requests); some clients hang up mid-request, and the server must stay healthy throughout.
// Non-obvious choice: hang-ups use node:http and destroy the socket, because an aborted fetch() body
// read can stay pending forever in some Node versions, which would hang the test, not the server.
import http from 'node:http';
import { withServer, check } from './server_harness.mjs';

const CLIENTS = Number(process.env.LOAD_CLIENTS ?? 32);
const SECONDS = Number(process.env.LOAD_SECONDS ?? 20);
// Half chat, half raw completions; the random-weight model answers raw prompts far more distinctly.
const PROMPTS = [
  { chat: 'Tell me about France.' }, { completion: 'The capital of France' },
  { chat: 'Write fibonacci in python please, it is urgent and important.' }, { completion: 'def fibonacci(n):' },
  { chat: 'x' }, { completion: 'Once upon a time, 17 dragons' },
  { chat: 'Summarize the plot of a novel about a lighthouse keeper in three sentences.' },
  { completion: 'SELECT * FROM users WHERE' },
];

function request(i, stream) {
  const p = PROMPTS[i];
  const common = { temperature: 0, max_tokens: 8, stream };
  if (p.chat) {
    return ['/v1/chat/completions', { ...common, messages: [{ role: 'user', content: p.chat }], chat_template_kwargs: { enable_thinking: false } }];
  }
  return ['/v1/completions', { ...common, prompt: p.completion }];
}

function pieceOf(e) {
  const c = e.choices?.[0];
  if (!c) return '';
  return c.text ?? c.delta?.content ?? c.message?.content ?? '';
}

async function answer(base, i, stream) {
  const [path, body] = request(i, stream);
  const res = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const raw = await res.text();
  if (res.status !== 200) return { status: res.status, res, text: raw };
  if (!stream) return { status: 200, content: pieceOf(JSON.parse(raw)) };
  let content = '', done = false;
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const data = line.slice(6);
    if (data === '[DONE]') { done = true; continue; }
    const e = JSON.parse(data);
    if (e.error) throw new Error(`stream error: ${data}`);
    content += pieceOf(e);
  }
  check(done, 'stream ends with [DONE]');
  return { status: 200, content };
}

// Sends a streaming request and destroys the connection after the first bytes or 50 ms.
function hangUp(base, i) {
  const [path, body] = request(i, true);
  return new Promise((resolve) => {
    const req = http.request(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      res.once('data', () => { req.destroy(); resolve(); });
      res.on('error', resolve);
      res.on('end', resolve);
    });
    req.on('error', resolve);
    req.on('close', resolve);
    setTimeout(() => { req.destroy(); resolve(); }, 50);
    req.end(JSON.stringify(body));
  });
}

await withServer('load_concurrency', ['--max-queue', '8'], async (server) => {
  const base = server.baseURL;
  // Each prompt alone, first.
  const expected = [];
  for (let i = 0; i < PROMPTS.length; i++) expected.push((await answer(base, i, false)).content);
  console.log(`baseline answers: ${JSON.stringify(expected)}`);
  check(new Set(expected).size >= 2, 'prompts have distinct answers (else mixing would go unnoticed)');

  const counts = { ok: 0, rejected: 0, hung_up: 0 };
  const deadline = Date.now() + SECONDS * 1000;
  async function client(id) {
    let n = 0;
    while (Date.now() < deadline) {
      const i = (id + n) % PROMPTS.length;
      const stream = (id + n) % 2 === 0;
      n++;
      if ((id * 3 + n) % 11 === 0) {
        await hangUp(base, i);
        counts.hung_up++;
        continue;
      }
      const r = await answer(base, i, stream);
      if (r.status === 503) {
        check(r.res.headers.get('retry-after') !== null, '503 carries Retry-After');
        check(JSON.parse(r.text).error?.message, '503 carries a JSON error');
        counts.rejected++;
        await new Promise((res) => setTimeout(res, 20));
        continue;
      }
      check(r.status === 200, `status ${r.status}: ${r.text}`);
      check(r.content === expected[i], `prompt ${i} under load: ${JSON.stringify(r.content)} != ${JSON.stringify(expected[i])}`);
      counts.ok++;
    }
  }
  await Promise.all(Array.from({ length: CLIENTS }, (_, id) => client(id)));
  console.log(`load: ${JSON.stringify(counts)} in ${SECONDS} s with ${CLIENTS} clients`);
  check(counts.ok > 0, 'some requests succeeded');

  const health = await fetch(`${base}/health`);
  check(health.status === 200, 'healthy after load');
  // Hung-up requests still queued are cancelled when their turn comes; wait for the queue to drain.
  let metrics = '';
  for (let t = 0; t < 100; t++) {
    metrics = await (await fetch(`${base}/metrics`)).text();
    if (/deltaserve_queue_depth 0\n/.test(metrics) && /deltaserve_requests_in_flight 0\n/.test(metrics)) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  check(/deltaserve_queue_depth 0\n/.test(metrics) && /deltaserve_requests_in_flight 0\n/.test(metrics), 'queue drained');
  console.log(metrics.split('\n').filter((l) => /^deltaserve_(requests_total|generations)/.test(l)).join('\n'));
  // After the storm, each prompt still gets its answer.
  for (let i = 0; i < PROMPTS.length; i++) check((await answer(base, i, false)).content === expected[i], `prompt ${i} after load`);
});
