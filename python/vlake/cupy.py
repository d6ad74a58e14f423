"""vlake.cupy: CuPy's memory pool gives its cache back when vlaked asks (docs/hook.md, "Reclaim").

    import vlake
    vlake.cupy.enable_reclaim()

The hook runs the default memory pool's free_all_blocks() on its own thread when another
tenant's allocation needs the memory (see vlake.torch for the rules). Arrays in use are never
touched.
"""
import cupy as _cupy

import vlake as _vlake

_handle = None


def _reclaim(device, nbytes):
    pool = _cupy.get_default_memory_pool()
    before = pool.total_bytes()
    pool.free_all_blocks()
    return max(0, before - pool.total_bytes())


def enable_reclaim():
    """Registers the default memory pool's free_all_blocks() as a reclaim callback (once)."""
    global _handle
    if _handle is None:
        _handle = _vlake.enable_reclaim(_reclaim)
    return _handle


def disable_reclaim():
    global _handle
    if _handle is not None:
        _vlake.disable_reclaim(_handle)
        _handle = None
