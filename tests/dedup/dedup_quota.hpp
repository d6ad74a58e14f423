// The quota file of the transparent-dedup tests: namespace `infer` (the listed users) shares
// uploads transparently within dedup domain `infer`; everyone else is in `default` (off).
// Every tenant's limit is 256 MiB.
#pragma once

#include <string>

namespace vlake::deduptest {

inline std::string transparent_quota(const std::string& users) {
  return "version: 1\n"
         "default:\n"
         "  limit: 256MiB\n"
         "namespaces:\n"
         "  - name: infer\n"
         "    dedup: transparent\n"
         "    dedup_domain: infer\n"
         "    users: [" +
         users + "]\n";
}

}  // namespace vlake::deduptest
