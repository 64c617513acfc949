'use strict';
// A shardq client in Node, from the protos alone (docs/clients.md):
//   1. where the tenant lives (TenantService.GetTenantStats) and its slot (slot.js);
//   2. submit a job with a request_id, retrying with the SAME request_id on UNAVAILABLE and
//      RESOURCE_EXHAUSTED (honouring RetryInfo), then once more to show the dedupe;
//   3. wait for it with WatchJob and print its state and result;
//   4. a bad submit (priority -1) and its google.rpc.BadRequest details.
//
//   SHARDQ_COORDINATOR=127.0.0.1:50051 SHARDQ_TOKEN=... node submit.js [REQUEST_ID]
//
// The coordinator here is plaintext, as `shardq dev` runs it; for TLS use
// grpc.credentials.createSsl(fs.readFileSync(caFile)) instead of createInsecure().

const path = require('node:path');
const crypto = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');
const { slotOf } = require('./slot');

// proto/ of the repository: shardq/v1/*.proto and the google/rpc protos of the error details.
const PROTO_ROOT = path.resolve(__dirname, '..', '..', '..', 'proto');
const TERMINAL = new Set(['JOB_STATE_SUCCEEDED', 'JOB_STATE_DEAD', 'JOB_STATE_CANCELLED']);
// Codes after which the same request (same request_id) may be sent again: it cannot make a
// second job. See docs/clients.md, "Errors".
const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.RESOURCE_EXHAUSTED]);

const target = process.env.SHARDQ_COORDINATOR || '127.0.0.1:50051';
const token = process.env.SHARDQ_TOKEN;
if (!token) {
  console.error('set SHARDQ_TOKEN to a tenant token (shardq dev prints one)');
  process.exit(2);
}

const options = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const definition = protoLoader.loadSync(['shardq/v1/jobs.proto', 'shardq/v1/tenants.proto'], {
  ...options,
  includeDirs: [PROTO_ROOT],
});
const v1 = grpc.loadPackageDefinition(definition).shardq.v1;
const credentials = grpc.credentials.createInsecure();
const jobs = new v1.JobService(target, credentials);
const tenants = new v1.TenantService(target, credentials);

// Every call carries the bearer token.
function metadata() {
  const md = new grpc.Metadata();
  md.set('authorization', `Bearer ${token}`);
  return md;
}

// google.rpc.Status, packed by the server into the grpc-status-details-bin trailer.
const rpc = new protobuf.Root();
rpc.resolvePath = (_origin, target) => path.join(PROTO_ROOT, target);
rpc.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
const Status = rpc.lookupType('google.rpc.Status');

// The details of a failed call as [typeName, object] pairs (BadRequest, RetryInfo, ...).
function errorDetails(err) {
  const [raw] = (err.metadata && err.metadata.get('grpc-status-details-bin')) || [];
  if (!raw) return [];
  return Status.decode(raw).details.map((any) => {
    const name = any.type_url.slice(any.type_url.lastIndexOf('/') + 1);
    const type = rpc.lookupType(name);
    return [name, type.toObject(type.decode(any.value), { longs: Number })];
  });
}

function retryDelayMs(err, attempt) {
  for (const [name, detail] of errorDetails(err)) {
    if (name === 'google.rpc.RetryInfo' && detail.retry_delay) {
      const { seconds = 0, nanos = 0 } = detail.retry_delay;
      return seconds * 1000 + Math.ceil(nanos / 1e6);
    }
  }
  // No RetryInfo (UNAVAILABLE): exponential backoff with full jitter, 0.2 s doubling.
  return Math.random() * 200 * 2 ** attempt;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + 30_000);
    client[method](request, metadata(), { deadline }, (err, reply) =>
      err ? reject(err) : resolve(reply),
    );
  });
}

async function submit(spec, attempts = 5) {
  for (let attempt = 0; ; attempt += 1) {
    try {
      return await unary(jobs, 'SubmitJob', { job: spec });
    } catch (err) {
      if (!RETRYABLE.has(err.code) || attempt + 1 >= attempts) throw err;
      const delayMs = retryDelayMs(err, attempt);
      console.error(`${statusName(err.code)}: retrying in ${Math.round(delayMs)} ms, same request_id`);
      await sleep(delayMs);
    }
  }
}

// WatchJob streams the job's states and ends after a terminal one.
function waitFor(jobId, timeoutMs = 120_000) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + timeoutMs);
    const call = jobs.WatchJob({ job_id: jobId }, metadata(), { deadline });
    let last = null;
    call.on('data', (job) => {
      last = job;
      if (TERMINAL.has(job.state)) {
        call.cancel();
        resolve(job);
      }
    });
    call.on('error', (err) => {
      if (err.code !== grpc.status.CANCELLED || !last || !TERMINAL.has(last.state)) reject(err);
    });
    call.on('end', () => (last && TERMINAL.has(last.state) ? resolve(last) : reject(new Error('stream ended early'))));
  });
}

function statusName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) || String(code);
}

async function main() {
  const stats = await unary(tenants, 'GetTenantStats', {});
  console.log(`tenant ${stats.tenant_id} on shard ${stats.shard_id} (slot ${slotOf(stats.tenant_id)})`);

  const requestId = process.argv[2] || `node-example-${crypto.randomUUID()}`;
  const spec = {
    request_id: requestId,
    handler: 'echo',
    payload: Buffer.from(JSON.stringify({ hello: 'node' })),
  };
  const first = await submit(spec);
  console.log(`submitted ${first.job.job_id} request_id ${requestId} deduplicated ${first.deduplicated}`);
  const again = await submit(spec);
  console.log(`resubmitted ${again.job.job_id} deduplicated ${again.deduplicated}`);

  const done = await waitFor(first.job.job_id);
  const result = done.result.length ? JSON.parse(done.result.toString('utf8')) : null;
  console.log(`${done.state} ${JSON.stringify(result)}`);

  try {
    await submit({ handler: 'echo', payload: Buffer.from('{}'), priority: -1 });
    throw new Error('a priority of -1 was accepted');
  } catch (err) {
    if (err.code === undefined) throw err;
    console.log(`${statusName(err.code)} ${err.details}`);
    for (const [name, detail] of errorDetails(err)) {
      for (const v of detail.field_violations || []) {
        console.log(`  ${name} ${v.field}: ${v.description}`);
      }
    }
  }
  jobs.close();
  tenants.close();
}

main().catch((err) => {
  console.error(err.code === undefined ? err : `${statusName(err.code)}: ${err.details}`);
  process.exit(1);
});
