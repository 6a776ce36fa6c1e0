// What ATen allocates inside an arena executor's node (intermediates, kernel scratch, results
// without an `.out` variant), served from the arena's own bytes that no planned tensor holds at
// that node: a c10 CPU allocator over a list of free ranges the executor gives it before each
// node (arena_scratch.py). Those pages are the arena's, counted in its size and mostly resident
// already, so a freed intermediate's pages are served again without a fault and nothing of it
// is left in the malloc's heap to purge. Best fit, lowest address first, freed blocks merged
// with their free neighbours; a request no range fits goes to the allocator installed before
// (counted). Every block must be freed by the node's end (the executor copies what the node
// keeps into its slot): the next node's ranges may hold planned tensors there. A block freed
// after its node (its ranges gone) is only forgotten. Thread-safe (intra-op threads allocate).
// Built at first use (torch.utils.cpp_extension), called through ctypes: extern "C" below.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr uintptr_t kAlignment = 64;  // c10's CPU alignment (gAlignment)

struct Used {
  uintptr_t bytes;
  uint64_t node;  // the node (epoch) it was served in
};

std::mutex mutex;
std::map<uintptr_t, uintptr_t> free_at;                  // address -> bytes
std::set<std::pair<uintptr_t, uintptr_t>> free_by_size;  // (bytes, address)
std::unordered_map<uintptr_t, Used> used;                // address -> block
std::vector<std::pair<uintptr_t, uintptr_t>> ranges;     // this node's [lo, hi), sorted
std::vector<uintptr_t> reached;                          // per range: highest byte served
uint64_t node = 0;
uint64_t live_now = 0;  // blocks of this node not yet freed
c10::Allocator* previous = nullptr;
c10::DeleterFnPtr previous_raw_deleter = nullptr;
// served, served bytes, fallbacks, fallback bytes, freed late (after their node), live bytes peak
uint64_t counts[6] = {0, 0, 0, 0, 0, 0};
uint64_t live_bytes = 0;

void add_free(uintptr_t at, uintptr_t bytes) {
  free_at[at] = bytes;
  free_by_size.insert({bytes, at});
}

void drop_free(std::map<uintptr_t, uintptr_t>::iterator it) {
  free_by_size.erase({it->second, it->first});
  free_at.erase(it);
}

void* take(uintptr_t bytes) {
  auto fit = free_by_size.lower_bound({bytes, 0});
  if (fit == free_by_size.end()) return nullptr;
  uintptr_t at = fit->second, have = fit->first;
  drop_free(free_at.find(at));
  if (have > bytes) add_free(at + bytes, have - bytes);
  used[at] = {bytes, node};
  live_now += 1;
  live_bytes += bytes;
  counts[5] = std::max<uint64_t>(counts[5], live_bytes);
  auto range = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(at, UINTPTR_MAX));
  size_t index = static_cast<size_t>(range - ranges.begin()) - 1;
  reached[index] = std::max(reached[index], at + bytes);
  return reinterpret_cast<void*>(at);
}

void give(uintptr_t start, uintptr_t bytes) {
  uintptr_t end = start + bytes;
  auto next = free_at.lower_bound(end);
  if (next != free_at.end() && next->first == end) {
    end += next->second;
    drop_free(next);
  }
  auto after = free_at.lower_bound(start);
  if (after != free_at.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second == start) {
      start = before->first;
      drop_free(before);
    }
  }
  add_free(start, end - start);
}

void scratch_delete(void* ptr) {
  if (ptr == nullptr) return;
  std::unique_lock<std::mutex> lock(mutex);
  auto found = used.find(reinterpret_cast<uintptr_t>(ptr));
  if (found != used.end()) {
    uintptr_t at = found->first;
    Used block = found->second;
    used.erase(found);
    live_bytes -= block.bytes;
    if (block.node == node) {
      live_now -= 1;
      give(at, block.bytes);
    } else {
      counts[4] += 1;  // its ranges are gone: only forgotten
    }
    lock.unlock();
    c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(block.bytes), live_bytes, 0,
                                     c10::Device(c10::DeviceType::CPU));
    return;
  }
  c10::DeleterFnPtr raw = previous_raw_deleter;  // a raw allocation the fallback served
  lock.unlock();
  if (raw != nullptr) raw(ptr);
}

struct ScratchAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &scratch_delete, c10::Device(c10::DeviceType::CPU)};
    uintptr_t bytes = (n + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = nullptr;
    c10::Allocator* fallback = nullptr;
    uint64_t live = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ptr = take(bytes);
      if (ptr != nullptr) {
        counts[0] += 1;
        counts[1] += bytes;
        live = live_bytes;
      } else {
        counts[2] += 1;
        counts[3] += bytes;
        fallback = previous;
      }
    }
    if (ptr == nullptr) return fallback->allocate(n);
    c10::reportMemoryUsageToProfiler(ptr, static_cast<int64_t>(bytes), live, 0,
                                     c10::Device(c10::DeviceType::CPU));
    return {ptr, ptr, &scratch_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &scratch_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

ScratchAllocator allocator;
constexpr uint8_t kPriority = 2;  // above c10's default CPU allocator's (0)

}  // namespace

extern "C" {

// A new node: its free ranges (pairs lo, hi of absolute addresses, sorted, disjoint, aligned),
// then c10's CPU allocator is ours. Returns the blocks of the node before still live (0 when
// all is well; else they were forgotten and their addresses may be given out again).
uint64_t arena_scratch_begin(const uint64_t* pairs, uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex);
  uint64_t leaked = live_now;
  node += 1;
  live_now = 0;
  free_at.clear();
  free_by_size.clear();
  ranges.clear();
  for (uint64_t i = 0; i < n; ++i) {
    ranges.push_back({pairs[2 * i], pairs[2 * i + 1]});
    add_free(pairs[2 * i], pairs[2 * i + 1] - pairs[2 * i]);
  }
  reached.assign(ranges.size(), 0);
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current != &allocator) {
    previous = current;
    previous_raw_deleter = current->raw_deleter();
    c10::SetCPUAllocator(&allocator, kPriority);
  }
  return leaked;
}

// The node has run: the previous allocator again. Writes, for each range, the highest byte
// served from it (0: none) into `reached_out` (n entries); returns the node's blocks still live.
uint64_t arena_scratch_end(uint64_t* reached_out, uint64_t n) {
  if (previous != nullptr && c10::GetCPUAllocator() == &allocator)
    c10::SetCPUAllocator(previous, kPriority);
  std::lock_guard<std::mutex> lock(mutex);
  for (uint64_t i = 0; i < n && i < reached.size(); ++i) reached_out[i] = reached[i];
  return live_now;
}

// The node's blocks still live (all must be freed by its end).
uint64_t arena_scratch_live() {
  std::lock_guard<std::mutex> lock(mutex);
  return live_now;
}

// Whether `ptr` is a live block served here.
int arena_scratch_holds(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(mutex);
  return used.count(static_cast<uintptr_t>(ptr)) ? 1 : 0;
}

// Whether c10's CPU allocator is ours right after installing it (0: another of a higher
// priority is set, and stays).
int arena_scratch_installs() {
  c10::Allocator* current = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&allocator, kPriority);
  int ours = c10::GetCPUAllocator() == &allocator;
  if (ours && current != &allocator) c10::SetCPUAllocator(current, kPriority);
  return ours;
}

// served, served bytes, fallbacks, fallback bytes, freed after their node, live bytes peak
void arena_scratch_counts(uint64_t* out) {
  std::lock_guard<std::mutex> lock(mutex);
  std::copy(counts, counts + 6, out);
}

}  // extern "C"
