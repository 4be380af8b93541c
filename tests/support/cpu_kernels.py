"""Which CPU codec kernel levels this machine runs: detected by switching them
on (the codec refuses what the CPU lacks), never assumed."""
from fp8comm import _C


def _can_switch_on(setter):
    """Whether the codec runs these kernels on this CPU; the old setting is restored."""
    try:
        old = setter(True)
    except RuntimeError:
        return False
    setter(old)
    return True


HAS_AVX2 = _can_switch_on(_C.set_cpu_simd)
HAS_AVX512 = HAS_AVX2 and _can_switch_on(_C.set_cpu_avx512)
