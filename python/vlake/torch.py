"""vlake.torch: PyTorch's caching allocator gives its cache back when vlaked asks (docs/hook.md,
"Reclaim").

    import vlake
    vlake.torch.enable_reclaim()

Freed tensors stay in PyTorch's cache, which the node counts as used. With reclaim enabled, when
another tenant's allocation cannot be served (this tenant has the same or a lower priority, and
is among the most idle), the hook runs torch.cuda.empty_cache() on its own thread; the memory
goes back to the pool and the waiting allocation goes on. Tensors in use are never touched.
"""
import torch as _torch

import vlake as _vlake


def _reclaim(device, nbytes):
    if not _torch.cuda.is_initialized():
        return 0
    before = _torch.cuda.memory_reserved(device)
    _torch.cuda.empty_cache()
    return max(0, before - _torch.cuda.memory_reserved(device))


_registration = _vlake._FrameworkReclaim(_reclaim)


def enable_reclaim():
    """Registers torch.cuda.empty_cache() as this process's reclaim callback (once); returns its handle."""
    return _registration.enable()


def disable_reclaim():
    """Unregisters it (waits for a run in progress)."""
    _registration.disable()
