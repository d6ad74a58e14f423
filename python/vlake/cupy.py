"""vlake.cupy: CuPy's memory pool gives its cache back when vlaked asks (docs/hook.md, "Reclaim").

    import vlake
    vlake.cupy.enable_reclaim()

The hook runs the default memory pool's free_all_blocks() on its own thread when another
tenant's allocation needs the memory (see vlake.torch for the rules). Arrays in use are never
touched.
"""
import cupy as _cupy

import vlake as _vlake


def _reclaim(device, nbytes):
    pool = _cupy.get_default_memory_pool()
    before = pool.total_bytes()
    pool.free_all_blocks()
    return max(0, before - pool.total_bytes())


_registration = _vlake._FrameworkReclaim(_reclaim)


def enable_reclaim():
    """Registers the default memory pool's free_all_blocks() as this process's reclaim callback (once); returns its handle."""
    return _registration.enable()


def disable_reclaim():
    """Unregisters it (waits for a run in progress)."""
    _registration.disable()
