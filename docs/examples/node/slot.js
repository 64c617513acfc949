'use strict';
// The placement rule of docs/clients.md in JavaScript: a tenant's slot is the unsigned
// 32-bit MurmurHash3 (x86_32, seed 0) of the tenant ID's UTF-8 bytes, modulo 16384.
// (shardq.common.placement.slot_of in Python; the test compares the two.) Which shard owns a
// slot is the shard map's business, and pins and moves override it: to learn a tenant's shard,
// ask TenantService.GetTenantStats (shard_id) rather than compute it.

const SLOT_COUNT = 16384;

function murmur3x86_32(bytes, seed) {
  const c1 = 0xcc9e2d51;
  const c2 = 0x1b873593;
  let h = seed >>> 0;
  const blocks = bytes.length & ~3;
  for (let i = 0; i < blocks; i += 4) {
    // Each 4-byte block is read little-endian, whatever the machine's byte order.
    let k = bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24);
    k = Math.imul(k, c1);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, c2);
    h ^= k;
    h = (h << 13) | (h >>> 19);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  let k = 0;
  switch (bytes.length & 3) {
    case 3:
      k ^= bytes[blocks + 2] << 16;
    // falls through
    case 2:
      k ^= bytes[blocks + 1] << 8;
    // falls through
    case 1:
      k ^= bytes[blocks];
      k = Math.imul(k, c1);
      k = (k << 15) | (k >>> 17);
      k = Math.imul(k, c2);
      h ^= k;
  }
  h ^= bytes.length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

function slotOf(tenantId) {
  return murmur3x86_32(Buffer.from(tenantId, 'utf8'), 0) % SLOT_COUNT;
}

module.exports = { SLOT_COUNT, murmur3x86_32, slotOf };

if (require.main === module) {
  // node slot.js TENANT...: one "TENANT SLOT" line each.
  for (const tenant of process.argv.slice(2)) console.log(`${tenant} ${slotOf(tenant)}`);
}
