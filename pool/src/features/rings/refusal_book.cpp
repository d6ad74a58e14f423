#include "vlake/pool/features/rings/refusal_book.hpp"

namespace vlake::pool {

void RefusalBook::resume(const state::RefusalLog& old) {
  log_ = old;
  resume_ring(ring_, log_.refusals);
}

}  // namespace vlake::pool
