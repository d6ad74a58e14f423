// PTX of the kernels vlake launches through the driver API (JIT-compiled by the driver, so no
// CUDA compiler is needed to build vlake). sim/ executes the same entry points on the host.
//
// Source (kernels.cu), regenerate with `nvcc -ptx -arch=compute_75 kernels.cu`:
//   extern "C" __global__ void vlake_fill_u32(unsigned* p, unsigned long long n, unsigned v) {
//     for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//          i < n; i += (unsigned long long)gridDim.x * blockDim.x)
//       p[i] = v;
//   }
//   // The lanes of vlake::chunk_hash_reference (common/include/vlake/common/chunk_hash.hpp):
//   extern "C" __global__ void vlake_hash_u64(const unsigned long long* __restrict__ p,
//                                             unsigned long long n,
//                                             unsigned long long* __restrict__ partials) {
//     const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
//     const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
//     unsigned long long acc = (t + 1ull) * 0x9e3779b97f4a7c15ull;
//     for (unsigned long long i = t; i < n; i += stride) {
//       acc = (acc ^ p[i]) * 0xff51afd7ed558ccdull;
//       acc ^= acc >> 29;
//     }
//     partials[t] = acc;
//   }
// (nvcc 13 writes `.version 9.0`; the text below keeps 8.0, which these instructions need.)
#pragma once

namespace vlake::detail {

inline constexpr const char* kKernelsPtx = R"PTX(
.version 8.0
.target sm_75
.address_size 64

.visible .entry vlake_fill_u32(
	.param .u64 vlake_fill_u32_param_0,
	.param .u64 vlake_fill_u32_param_1,
	.param .u32 vlake_fill_u32_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<15>;

	ld.param.u64 	%rd7, [vlake_fill_u32_param_0];
	ld.param.u64 	%rd8, [vlake_fill_u32_param_1];
	ld.param.u32 	%r1, [vlake_fill_u32_param_2];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	cvt.u64.u32 	%rd1, %r3;
	mul.wide.u32 	%rd9, %r2, %r3;
	mov.u32 	%r4, %tid.x;
	cvt.u64.u32 	%rd10, %r4;
	add.s64 	%rd14, %rd9, %rd10;
	setp.ge.u64 	%p1, %rd14, %rd8;
	@%p1 bra 	$L__BB0_3;

	mov.u32 	%r5, %nctaid.x;
	cvt.u64.u32 	%rd11, %r5;
	mul.lo.s64 	%rd3, %rd11, %rd1;
	cvta.to.global.u64 	%rd4, %rd7;

$L__BB0_2:
	shl.b64 	%rd12, %rd14, 2;
	add.s64 	%rd13, %rd4, %rd12;
	st.global.u32 	[%rd13], %r1;
	add.s64 	%rd14, %rd14, %rd3;
	setp.lt.u64 	%p2, %rd14, %rd8;
	@%p2 bra 	$L__BB0_2;

$L__BB0_3:
	ret;
}

.visible .entry vlake_hash_u64(
	.param .u64 vlake_hash_u64_param_0,
	.param .u64 vlake_hash_u64_param_1,
	.param .u64 vlake_hash_u64_param_2
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<26>;

	ld.param.u64 	%rd10, [vlake_hash_u64_param_0];
	ld.param.u64 	%rd11, [vlake_hash_u64_param_1];
	ld.param.u64 	%rd12, [vlake_hash_u64_param_2];
	mov.u32 	%r1, %ntid.x;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %tid.x;
	mad.lo.s32 	%r4, %r2, %r1, %r3;
	cvt.u64.u32 	%rd1, %r4;
	mul.lo.s64 	%rd13, %rd1, -7046029254386353131;
	add.s64 	%rd25, %rd13, -7046029254386353131;
	setp.ge.u64 	%p1, %rd1, %rd11;
	@%p1 bra 	$L__BB1_3;

	mov.u32 	%r5, %nctaid.x;
	mul.wide.u32 	%rd3, %r5, %r1;
	cvta.to.global.u64 	%rd4, %rd10;
	mov.u64 	%rd23, %rd1;

$L__BB1_2:
	shl.b64 	%rd14, %rd23, 3;
	add.s64 	%rd15, %rd4, %rd14;
	ld.global.nc.u64 	%rd16, [%rd15];
	xor.b64  	%rd17, %rd16, %rd25;
	mul.lo.s64 	%rd18, %rd17, -49064778989728563;
	shr.u64 	%rd19, %rd18, 29;
	xor.b64  	%rd25, %rd19, %rd18;
	add.s64 	%rd23, %rd23, %rd3;
	setp.lt.u64 	%p2, %rd23, %rd11;
	@%p2 bra 	$L__BB1_2;

$L__BB1_3:
	cvta.to.global.u64 	%rd20, %rd12;
	shl.b64 	%rd21, %rd1, 3;
	add.s64 	%rd22, %rd20, %rd21;
	st.global.u64 	[%rd22], %rd25;
	ret;
}
)PTX";

inline constexpr const char* kFillU32Kernel = "vlake_fill_u32";
inline constexpr const char* kHashU64Kernel = "vlake_hash_u64";

}  // namespace vlake::detail
