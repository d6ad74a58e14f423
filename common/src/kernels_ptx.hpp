// PTX of the kernels vlake launches through the driver API (JIT-compiled by the driver, so no
// CUDA compiler is needed to build vlake). sim/ executes the same entry points on the host.
//
// Source (kernels.cu), regenerate with `nvcc -ptx -arch=compute_75 kernels.cu`:
//   extern "C" __global__ void vlake_fill_u32(unsigned* p, unsigned long long n, unsigned v) {
//     for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//          i < n; i += (unsigned long long)gridDim.x * blockDim.x)
//       p[i] = v;
//   }
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
)PTX";

inline constexpr const char* kFillU32Kernel = "vlake_fill_u32";

}  // namespace vlake::detail
