// A block of host memory with its own way of being freed: ordinary heap memory, or memory a
// device backend pinned and mapped for its copy engines (KvPool::AllocateHostBuffer). Code that
// only reads and writes the bytes takes a HostBuffer and does not care which it is; a transfer
// that may still land after its caller gave up holds a shared_ptr to it.
//
//   std::shared_ptr<HostBuffer> buf = HostBuffer::Allocate(bytes);   // heap, uninitialized
//   std::memcpy(buf->data(), src, bytes);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>

namespace strata {

class HostBuffer {
 public:
  // `release(data)` runs once, when the buffer is destroyed.
  HostBuffer(uint8_t* data, size_t size, std::function<void(uint8_t*)> release)
      : data_(data), size_(size), release_(std::move(release)) {}
  ~HostBuffer() {
    if (release_) release_(data_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  // `bytes` of heap memory, not initialized (a fetch overwrites all of it).
  static std::shared_ptr<HostBuffer> Allocate(size_t bytes) {
    uint8_t* p = new uint8_t[bytes > 0 ? bytes : 1];
    return std::make_shared<HostBuffer>(p, bytes, [](uint8_t* q) { delete[] q; });
  }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() const { return {data_, size_}; }

 private:
  uint8_t* data_;
  size_t size_;
  std::function<void(uint8_t*)> release_;
};

}  // namespace strata
