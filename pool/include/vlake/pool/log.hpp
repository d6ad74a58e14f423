// Compatibility include: vlaked's logger is vlake's one logger, vlake::Logger in
// vlake/common/log.hpp; include that. Kept so that code written against the old
// vlake::pool::Logger / vlake::pool::LogLevel names still compiles.
#pragma once

#include "vlake/common/log.hpp"

namespace vlake::pool {
using vlake::Logger;
using vlake::LogLevel;
}  // namespace vlake::pool
