// MemFile: a FILE* backed by memory (open_memstream), read back as lines, for tests of loggers
// that write to a FILE*.

#ifndef TESTS_TESTING_MEM_FILE_H_
#define TESTS_TESTING_MEM_FILE_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace bus::testing {

class MemFile {
 public:
  MemFile() : file_(open_memstream(&buf_, &size_)) {}
  ~MemFile() {
    std::fclose(file_);
    std::free(buf_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  std::FILE* get() { return file_; }
  // The lines written so far. Only while no one writes (open_memstream's buffer moves).
  std::vector<std::string> Lines() {
    std::fflush(file_);
    return absl::StrSplit(std::string(buf_, size_), '\n', absl::SkipEmpty());
  }

 private:
  char* buf_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

}  // namespace bus::testing

#endif  // TESTS_TESTING_MEM_FILE_H_
