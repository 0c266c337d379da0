// Host memory advice for large buffers written once (snapshot streams, files read whole).
#pragma once

#include <cstddef>

namespace ds {

// Asks the kernel to back the 2 MiB-aligned interior of [p, p + bytes) with transparent huge pages
// (Linux; a no-op elsewhere, for ranges under 4 MiB, or where the system refuses). A buffer of hundreds
// of MB otherwise takes a page fault per 4 KiB on its first write, which costs more than the write.
void advise_huge_pages(void* p, size_t bytes);

}  // namespace ds
