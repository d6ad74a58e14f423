// checkpoint_probe: measures what the driver's process checkpoint API
// (cuCheckpointProcessLock/Checkpoint/Restore/Unlock) does to a process whose memory was
// imported from another process, the way every vlake tenant's memory is (vlaked creates the
// handle, the tenant imports it from a POSIX file descriptor).
//
//   checkpoint_probe --mode plain|import-held|import-released [--gib N]
//     plain            the target allocates with cuMemAlloc (the baseline)
//     import-held      an owner process creates the memory, exports it as a file descriptor, the
//                      target imports and maps it; the owner keeps its handle meanwhile
//     import-released  the same, but the owner releases its handle once the target has mapped
//                      it, so the target holds the only reference
//
// The parent forks the owner and the target before it initialises CUDA itself, then: reads the
// device's used memory (nvidia-smi, and cuMemGetInfo in its own context), locks and checkpoints
// the target, reads again, lets the owner release its handle (import-held), reads again,
// restores and unlocks the target, reads again, and has the target verify its data. Each step
// prints one `key=value` line; the last line is `result=...`. Needs one GPU and a driver with
// the checkpoint API (>= 550); GPU-only, not part of the test suite.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

void check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(rc, &name);
    std::fprintf(stderr, "%s failed: %s (%d)\n", what, name ? name : "?", static_cast<int>(rc));
    std::exit(3);
  }
}

const char* err_name(CUresult rc) {
  const char* name = nullptr;
  cuGetErrorName(rc, &name);
  return name ? name : "?";
}

// One-byte commands over a socketpair; file descriptors travel with SCM_RIGHTS.
void send_byte(int sock, char c, int fd = -1) {
  msghdr msg{};
  iovec iov{&c, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  if (sendmsg(sock, &msg, 0) != 1) {
    std::perror("sendmsg");
    std::exit(3);
  }
}

char recv_byte(int sock, int* fd = nullptr) {
  char c = 0;
  msghdr msg{};
  iovec iov{&c, 1};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(sock, &msg, 0) != 1) {
    std::perror("recvmsg");
    std::exit(3);
  }
  if (fd != nullptr) {
    *fd = -1;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(cm), sizeof(int));
    }
  }
  return c;
}

CUcontext init_context() {
  check(cuInit(0), "cuInit");
  CUdevice dev = 0;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

CUmemAllocationProp fd_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// The owner: creates `bytes`, sends the fd over `handoff`, releases its handle when the parent
// says 'r' (answers 'k'), exits on 'q'.
int run_owner(int sock, int handoff, std::size_t bytes) {
  init_context();
  CUmemAllocationProp prop = fd_prop();
  CUmemGenericAllocationHandle handle = 0;
  check(cuMemCreate(&handle, bytes, &prop, 0), "owner cuMemCreate");
  int fd = -1;
  check(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "owner cuMemExportToShareableHandle");
  send_byte(handoff, 'h', fd);
  close(fd);
  bool held = true;
  for (;;) {
    char c = recv_byte(sock);
    if (c == 'r' && held) {
      check(cuMemRelease(handle), "owner cuMemRelease");
      held = false;
      send_byte(sock, 'k');
    } else if (c == 'q') {
      if (held) cuMemRelease(handle);
      return 0;
    }
  }
}

std::uint32_t pattern(std::size_t word) { return static_cast<std::uint32_t>(word * 2654435761u) ^ 0x5a5a1234u; }

// The target: gets its memory (own or imported), fills it with a pattern, then answers 'v'
// (verify: replies 'y' or 'n') and 'q'.
int run_target(int sock, std::size_t bytes, bool import, int owner_sock) {
  init_context();
  CUdeviceptr ptr = 0;
  if (!import) {
    check(cuMemAlloc(&ptr, bytes), "target cuMemAlloc");
  } else {
    int fd = -1;
    recv_byte(owner_sock, &fd);
    CUmemGenericAllocationHandle handle = 0;
    check(cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "target cuMemImportFromShareableHandle");
    close(fd);
    check(cuMemAddressReserve(&ptr, bytes, 0, 0, 0), "target cuMemAddressReserve");
    check(cuMemMap(ptr, bytes, 0, handle, 0), "target cuMemMap");
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(cuMemSetAccess(ptr, bytes, &access, 1), "target cuMemSetAccess");
    check(cuMemRelease(handle), "target cuMemRelease (mapping keeps it)");
  }
  const std::size_t chunk = 64 * kMiB;
  std::vector<std::uint32_t> host(chunk / 4);
  for (std::size_t off = 0; off < bytes; off += chunk) {
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = pattern(off / 4 + i);
    check(cuMemcpyHtoD(ptr + off, host.data(), chunk), "target fill");
  }
  check(cuCtxSynchronize(), "target sync");
  send_byte(sock, 'f');
  for (;;) {
    char c = recv_byte(sock);
    if (c == 'v') {
      bool ok = true;
      CUresult rc = CUDA_SUCCESS;
      for (std::size_t off = 0; off < bytes && ok; off += chunk) {
        rc = cuMemcpyDtoH(host.data(), ptr + off, chunk);
        if (rc != CUDA_SUCCESS) {
          std::printf("target_verify_error=%s\n", err_name(rc));
          ok = false;
          break;
        }
        for (std::size_t i = 0; i < host.size(); ++i) {
          if (host[i] != pattern(off / 4 + i)) {
            std::printf("target_mismatch_at=%zu\n", off + i * 4);
            ok = false;
            break;
          }
        }
      }
      std::fflush(stdout);
      send_byte(sock, ok ? 'y' : 'n');
    } else if (c == 'q') {
      return 0;
    }
  }
}

long smi_used_mib() {
  FILE* p = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0", "r");
  if (p == nullptr) return -1;
  long v = -1;
  if (std::fscanf(p, "%ld", &v) != 1) v = -1;
  pclose(p);
  return v;
}

void report(const char* step) {
  std::size_t free_b = 0;
  std::size_t total_b = 0;
  cuMemGetInfo(&free_b, &total_b);
  std::printf("%s: nvidia_smi_used_mib=%ld driver_free_mib=%zu\n", step, smi_used_mib(), free_b / kMiB);
  std::fflush(stdout);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "plain";
  std::size_t gib = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (std::strcmp(argv[i], "--gib") == 0) gib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  const bool import = mode != "plain";
  const bool release_early = mode == "import-released";
  if (mode != "plain" && mode != "import-held" && mode != "import-released") {
    std::fprintf(stderr, "usage: checkpoint_probe --mode plain|import-held|import-released [--gib N]\n");
    return 2;
  }
  const std::size_t bytes = gib << 30;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("mode=%s gib=%zu\n", mode.c_str(), gib);

  int target_sv[2];
  int owner_sv[2];    // parent <-> owner
  int handoff_sv[2];  // owner -> target (the fd)
  socketpair(AF_UNIX, SOCK_SEQPACKET, 0, target_sv);
  socketpair(AF_UNIX, SOCK_SEQPACKET, 0, owner_sv);
  socketpair(AF_UNIX, SOCK_SEQPACKET, 0, handoff_sv);
  pid_t owner = -1;
  if (import) {
    owner = fork();
    if (owner == 0) _exit(run_owner(owner_sv[1], handoff_sv[0], bytes));
  }
  pid_t target = fork();
  if (target == 0) _exit(run_target(target_sv[1], bytes, import, handoff_sv[1]));

  if (recv_byte(target_sv[0]) != 'f') return 3;
  init_context();
  std::printf("target_pid=%d owner_pid=%d\n", static_cast<int>(target), static_cast<int>(owner));
  report("filled");
  if (release_early) {
    send_byte(owner_sv[0], 'r');
    recv_byte(owner_sv[0]);
    report("owner_released_before_checkpoint");
  }

  auto t0 = std::chrono::steady_clock::now();
  CUresult rc = cuCheckpointProcessLock(static_cast<int>(target), nullptr);
  std::printf("lock=%s seconds=%.3f\n", err_name(rc), seconds_since(t0));
  bool checkpointed = false;
  if (rc == CUDA_SUCCESS) {
    t0 = std::chrono::steady_clock::now();
    rc = cuCheckpointProcessCheckpoint(static_cast<int>(target), nullptr);
    std::printf("checkpoint=%s seconds=%.3f\n", err_name(rc), seconds_since(t0));
    checkpointed = rc == CUDA_SUCCESS;
    CUprocessState state{};
    cuCheckpointProcessGetState(static_cast<int>(target), &state);
    std::printf("state_after_checkpoint=%d\n", static_cast<int>(state));
    report("after_checkpoint");
    if (import && !release_early) {
      send_byte(owner_sv[0], 'r');
      recv_byte(owner_sv[0]);
      report("after_owner_release");
    }
    if (checkpointed) {
      // Take the freed memory for a moment (another tenant would), then give it back.
      CUdeviceptr other = 0;
      CUresult arc = cuMemAlloc(&other, bytes);
      std::printf("parent_alloc_of_freed=%s\n", err_name(arc));
      if (arc == CUDA_SUCCESS) cuMemFree(other);
      t0 = std::chrono::steady_clock::now();
      rc = cuCheckpointProcessRestore(static_cast<int>(target), nullptr);
      std::printf("restore=%s seconds=%.3f\n", err_name(rc), seconds_since(t0));
      report("after_restore");
    }
    t0 = std::chrono::steady_clock::now();
    rc = cuCheckpointProcessUnlock(static_cast<int>(target), nullptr);
    std::printf("unlock=%s seconds=%.3f\n", err_name(rc), seconds_since(t0));
  }
  send_byte(target_sv[0], 'v');
  const bool intact = recv_byte(target_sv[0]) == 'y';
  std::printf("data_intact=%d\n", intact ? 1 : 0);
  report("end");
  send_byte(target_sv[0], 'q');
  if (owner > 0) send_byte(owner_sv[0], 'q');
  int status = 0;
  waitpid(target, &status, 0);
  if (owner > 0) waitpid(owner, &status, 0);
  std::printf("result=%s\n",
              checkpointed && intact ? "checkpointed-and-intact" : (intact ? "not-checkpointed" : "data-lost"));
  return 0;
}
