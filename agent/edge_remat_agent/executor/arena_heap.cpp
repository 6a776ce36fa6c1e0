// The arena executor's heap for what ATen allocates inside a node (intermediates, results it
// keeps where it put them): a c10 CPU allocator serving them from one region reserved once
// (mmap) and never given back while the run lasts, so that a freed block is served again
// without a page fault and nothing needs purging. Best fit, lowest address first, freed
// blocks merged with their free neighbours. A request the region cannot serve goes to the
// allocator that was installed before (counted). Built at first use by arena_heap.py
// (torch.utils.cpp_extension.load) and called through ctypes: extern "C" below.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kAlignment = 64;  // c10's CPU alignment (gAlignment)

struct Region {
  char* base = nullptr;
  size_t size = 0;
  bool active = true;  // new requests may come here; else it goes once its last block is freed
  std::map<size_t, size_t> free_at;                  // offset -> bytes
  std::set<std::pair<size_t, size_t>> free_by_size;  // (bytes, offset): best fit, lowest first
  std::unordered_map<size_t, size_t> used;           // offset -> bytes
  size_t live = 0, high_water = 0;

  void add_free(size_t offset, size_t bytes) {
    free_at[offset] = bytes;
    free_by_size.insert({bytes, offset});
  }
  void drop_free(std::map<size_t, size_t>::iterator it) {
    free_by_size.erase({it->second, it->first});
    free_at.erase(it);
  }
  void* take(size_t bytes) {
    auto fit = free_by_size.lower_bound({bytes, 0});
    if (fit == free_by_size.end()) return nullptr;
    size_t offset = fit->second, have = fit->first;
    drop_free(free_at.find(offset));
    if (have > bytes) add_free(offset + bytes, have - bytes);
    used[offset] = bytes;
    live += bytes;
    high_water = std::max(high_water, offset + bytes);
    return base + offset;
  }
  size_t give(void* ptr) {
    size_t offset = static_cast<char*>(ptr) - base;
    auto found = used.find(offset);
    if (found == used.end()) return 0;
    size_t bytes = found->second;
    used.erase(found);
    live -= bytes;
    size_t start = offset, end = offset + bytes;
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
    return bytes;
  }
  bool holds(const void* ptr) const {
    auto p = static_cast<const char*>(ptr);
    return p >= base && p < base + size;
  }
};

std::mutex mutex;
std::vector<std::unique_ptr<Region>> regions;  // the active one last; older ones until empty
c10::Allocator* previous = nullptr;            // the allocator installed before ours
c10::DeleterFnPtr previous_raw_deleter = nullptr;
uint64_t counts[6] = {0, 0, 0, 0, 0, 0};  // Give back the free whole pages of the active region (madvise MADV_DONTNEED: charged again
// only once written); the bytes given back.
uint64_t arena_heap_trim() {
  std::lock_guard<std::mutex> lock(mutex);
  if (regions.empty()) return 0;
  Region& r = *regions.back();
  uint64_t given = 0;
  for (const auto& [offset, bytes] : r.free_at) {
    uintptr_t start = reinterpret_cast<uintptr_t>(r.base + offset);
    uintptr_t end = start + bytes;
    start = (start + 4095) & ~uintptr_t(4095);
    end &= ~uintptr_t(4095);
    if (end > start && madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED) == 0)
      given += end - start;
  }
  return given;
}

// allocations, bytes, fallbacks, fallback bytes, frees, high water

void forget_if_done(size_t index) {
  Region& r = *regions[index];
  if (!r.active && r.used.empty()) {
    munmap(r.base, r.size);
    regions.erase(regions.begin() + index);
  }
}

void heap_delete(void* ptr) {
  if (ptr == nullptr) return;
  std::unique_lock<std::mutex> lock(mutex);
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i]->holds(ptr)) {
      size_t bytes = regions[i]->give(ptr);
      counts[4] += 1;
      size_t live = regions[i]->live, size = regions[i]->size;
      forget_if_done(i);
      lock.unlock();
      c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(bytes), live, size,
                                       c10::Device(c10::DeviceType::CPU));
      return;
    }
  }
  // A raw allocation the previous allocator served (raw_allocate of a fallback).
  c10::DeleterFnPtr raw = previous_raw_deleter;
  lock.unlock();
  if (raw != nullptr) raw(ptr);
}

struct RegionAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &heap_delete, c10::Device(c10::DeviceType::CPU)};
    size_t bytes = (n + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = nullptr;
    size_t live = 0, size = 0;
    c10::Allocator* fallback = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      Region* r = regions.empty() || !regions.back()->active ? nullptr : regions.back().get();
      if (r != nullptr) ptr = r->take(bytes);
      if (ptr != nullptr) {
        counts[0] += 1;
        counts[1] += bytes;
        counts[5] = std::max<uint64_t>(counts[5], r->high_water);
        live = r->live;
        size = r->size;
      } else {
        counts[2] += 1;
        counts[3] += bytes;
        fallback = previous;
      }
    }
    if (ptr == nullptr) return fallback->allocate(n);
    c10::reportMemoryUsageToProfiler(ptr, static_cast<int64_t>(bytes), live, size,
                                     c10::Device(c10::DeviceType::CPU));
    return {ptr, ptr, &heap_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &heap_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

RegionAllocator allocator;
constexpr uint8_t kPriority = 2;  // above c10's default CPU allocator's (0)

}  // namespace

extern "C" {

// Reserve a region of `bytes` (address space only: pages are charged once touched) for the
// requests to come. 0 on success, else errno.
int arena_heap_open(uint64_t bytes) {
  size_t size = (bytes + 4095) / 4096 * 4096;
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return errno ? errno : -1;
  std::lock_guard<std::mutex> lock(mutex);
  if (!regions.empty()) regions.back()->active = false;
  for (size_t i = regions.size(); i-- > 0;) forget_if_done(i);
  auto r = std::make_unique<Region>();
  r->base = static_cast<char*>(base);
  r->size = size;
  r->add_free(0, size);
  regions.push_back(std::move(r));
  std::fill(counts, counts + 6, 0);
  return 0;
}

// No new requests to the region: it is unmapped once its last block is freed.
void arena_heap_close() {
  std::lock_guard<std::mutex> lock(mutex);
  if (!regions.empty()) regions.back()->active = false;
  for (size_t i = regions.size(); i-- > 0;) forget_if_done(i);
}

// Make the region c10's CPU allocator (1: done; 0: another allocator of a higher priority
// is set, and stays).
int arena_heap_install() {
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &allocator) return 1;
  previous = current;
  previous_raw_deleter = current->raw_deleter();
  c10::SetCPUAllocator(&allocator, kPriority);
  return c10::GetCPUAllocator() == &allocator ? 1 : 0;
}

// Put back the allocator installed before.
void arena_heap_uninstall() {
  if (previous != nullptr && c10::GetCPUAllocator() == &allocator)
    c10::SetCPUAllocator(previous, kPriority);
}

// Give back the free whole pages of the active region (madvise MADV_DONTNEED: charged again
// only once written); the bytes given back.
uint64_t arena_heap_trim() {
  std::lock_guard<std::mutex> lock(mutex);
  if (regions.empty()) return 0;
  Region& r = *regions.back();
  uint64_t given = 0;
  for (const auto& [offset, bytes] : r.free_at) {
    uintptr_t start = reinterpret_cast<uintptr_t>(r.base + offset);
    uintptr_t end = start + bytes;
    start = (start + 4095) & ~uintptr_t(4095);
    end &= ~uintptr_t(4095);
    if (end > start && madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED) == 0)
      given += end - start;
  }
  return given;
}

// allocations, bytes, fallbacks, fallback bytes, frees, high water, live bytes, regions held
void arena_heap_counts(uint64_t* out) {
  std::lock_guard<std::mutex> lock(mutex);
  std::copy(counts, counts + 6, out);
  out[6] = regions.empty() ? 0 : regions.back()->live;
  out[7] = regions.size();
}

}  // extern "C"
