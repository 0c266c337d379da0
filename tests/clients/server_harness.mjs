// Starts `deltaserve serve` on a free port for one client test and stops it afterwards.
// Environment (set by ctest, see tests/CMakeLists.txt): DELTASERVE_EXE (the binary), DELTASERVE_MODEL
// (a GGUF; empty = the built-in demo model), DELTASERVE_CACHE_DIR (where the demo model is generated).
// Non-obvious choice: the server is started with --port 0 and the harness reads the chosen port from
// its "listening on" line, so parallel ctest runs never race for a port.
import { spawn } from 'node:child_process';

export async function startServer(extraArgs = []) {
  const exe = process.env.DELTASERVE_EXE;
  if (!exe) throw new Error('DELTASERVE_EXE is not set (run through ctest)');
  const args = ['serve'];
  if (process.env.DELTASERVE_MODEL) args.push(process.env.DELTASERVE_MODEL);
  args.push('--port', '0', '--ctx-size', '2048', '--threads', '2');
  if (process.env.DELTASERVE_CACHE_DIR) args.push('--cache-dir', process.env.DELTASERVE_CACHE_DIR);
  args.push(...extraArgs);
  const child = spawn(exe, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr += d.toString();
    if (process.env.DELTASERVE_VERBOSE) process.stderr.write(d);
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`server did not start in 120 s:\n${stderr}`)), 120000);
    child.stdout.on('data', (d) => {
      out += d.toString();
      const m = out.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited early (code ${code}, signal ${signal}):\n${stderr}`));
    });
  });
  return {
    port,
    baseURL: `http://127.0.0.1:${port}`,
    stderr: () => stderr,
    // SIGTERM, then the exit status; a server that does not exit within 10 s is killed and fails.
    async stop() {
      child.kill('SIGTERM');
      const timeout = new Promise((resolve) => setTimeout(() => resolve(null), 10000));
      const result = await Promise.race([exited, timeout]);
      if (result === null) {
        child.kill('SIGKILL');
        throw new Error('server did not exit within 10 s of SIGTERM');
      }
      return result;
    },
  };
}

// Runs `body(server)` against a fresh server and checks a clean exit; prints PASS/FAIL for ctest.
export async function withServer(name, extraArgs, body) {
  const server = await startServer(extraArgs);
  let failure = null;
  try {
    await body(server);
  } catch (e) {
    failure = e;
  }
  const { code, signal } = await server.stop();
  if (!failure && code !== 0) failure = new Error(`server exited with code ${code} signal ${signal}:\n${server.stderr()}`);
  if (failure) {
    console.error(`FAIL ${name}:`, failure);
    process.exit(1);
  }
  console.log(`PASS ${name}`);
}

export function check(cond, message) {
  if (!cond) throw new Error(`check failed: ${message}`);
}
