// Which K/V tiles a CTA of the varlen kernel visits, and in which order.
//
// Static (one split, or claims off): the tiles [tile_begin, tile_end) of the CTA's split, in order.
// Claims (split launches of decode tiles, VarlenKernelParams::claim_tiles): the splits of a work
// item share its tiles dynamically, so that a split on a faster SM, or one that started earlier,
// takes more of them and the item's CTAs finish together (measured on the H200: SMs differ by up
// to ~20% in the bandwidth they get, and CTAs of one launch start up to ~4 us apart). Split r
// of S first loads tiles r and S + r (the prologue needs them before any claim could return);
// later tiles come from the item's counter, claimed three iterations before they are needed:
//   iteration it, thread 0: publishes the claim issued at it - 1 as the tile of sequence number
//   it + kPro + 2 (read by everybody after the next barrier), then issues the next claim.
// Sequence numbers past the item's tiles are -1 and end the loop. A CTA's claims only grow, so its
// valid tiles are a prefix of its sequence and every claimed tile is visited; claims go on
// unconditionally until the loop ends (a few past the end: no branch waits on a claim's answer).
// The counter is the item's split counter (low 24 bits: claims, high 8 bits: arrivals), put back
// to 0 by the CTA that merges the item (after every split's last claim).
#pragma once
#include <cstdint>

#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn {

inline constexpr unsigned int kClaimMask = (1u << 24) - 1;  // low 24 bits of the item counter
inline constexpr unsigned int kArrivalUnit = 1u << 24;      // one split arriving for the merge
inline constexpr int kMaxClaimTiles = 1 << 23;              // items at least this long do not claim

// The split counter of the work item (unique among the launch's items; see combine_splits_if_last).
__device__ __forceinline__ unsigned int* item_counter(const VarlenKernelParams& p, const WorkItem& w) {
  return p.partials.counters + (static_cast<int64_t>(w.kv_head) * p.num_tokens + w.q_start) * p.group + w.m0;
}

__device__ __forceinline__ bool claims_tiles(const VarlenKernelParams& p, const WorkItem& w) {
  return p.claim_tiles && w.item_tiles < kMaxClaimTiles;
}

// kPro: tiles loaded in the prologue (kStages - 1).
template <int kPro>
struct TileSequence {
  bool claims;
  int begin, count;             // static: tiles [begin, begin + count)
  int lo, n, split, splits;     // claims: the item's tiles [lo, lo + n), this CTA's split of `splits`
  unsigned int* counter;
  int* ring;                    // shared, 8 entries: claimed tiles by sequence number
  unsigned int pending;         // thread 0: the counter's answer to the last claim issued (raw)

  __device__ __forceinline__ int item_tile(int64_t index) const { return index < n ? lo + static_cast<int>(index) : -1; }
  // Split `split`'s first tiles (the prologue's, and a guess at the next for the L2 prefetch).
  __device__ __forceinline__ int static_tile(int i) const {
    return claims ? item_tile(split + static_cast<int64_t>(splits) * i) : (i < count ? begin + i : -1);
  }
  __device__ __forceinline__ int claimed_tile(unsigned int raw) const {
    return item_tile(static_cast<int64_t>(splits) * kPro + (raw & kClaimMask));
  }
  // The tile of sequence number i, -1 past the CTA's last one. At iteration it (after its
  // barrier) numbers up to it + kPro + 1 are known.
  __device__ __forceinline__ int tile(int i) const {
    if (!claims || i < kPro) return static_tile(i);
    return ring[i & 7];
  }
  // Thread 0, prologue (before a barrier): sequence numbers kPro and kPro + 1 into the ring, a
  // third claim pending.
  __device__ __forceinline__ void claim_first() {
    const unsigned int c = atomicAdd(counter, 3u) & kClaimMask;
    ring[kPro & 7] = claimed_tile(c);
    ring[(kPro + 1) & 7] = claimed_tile(c + 1);
    pending = c + 2;
  }
  // Thread 0, iteration it (after its barrier): publish the pending claim as sequence number
  // it + kPro + 2, issue the next.
  __device__ __forceinline__ void step(int it) {
    ring[(it + kPro + 2) & 7] = claimed_tile(pending);
    pending = atomicAdd(counter, 1u);  // (its answer is first read at the next step)
  }
};

// kMayClaim: the kernel configuration supports claims (decode tiles); else always static.
template <int kPro, bool kMayClaim>
__device__ __forceinline__ TileSequence<kPro> tile_sequence(const VarlenKernelParams& p, const WorkItem& w, int* ring) {
  TileSequence<kPro> s;
  s.claims = kMayClaim && claims_tiles(p, w);
  s.begin = w.tile_begin;
  s.count = w.tile_end - w.tile_begin;
  s.lo = w.item_tile_lo;
  s.n = w.item_tiles;
  s.split = w.split;
  s.splits = p.num_splits;
  s.counter = item_counter(p, w);
  s.ring = ring;
  s.pending = 0;
  return s;
}

}  // namespace attnkit::flash_attn
