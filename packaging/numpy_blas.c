/* numpy's BLAS and LAPACK, served by the MKL inside torch's libtorch_cpu.so.
 *
 * numpy's wheel carries its own OpenBLAS (numpy.libs/libscipy_openblas64_-*.so, with libgfortran and libquadmath
 * ~28 MiB), while libtorch_cpu.so already holds MKL with the same 64-bit-integer (ILP64) interface. The bundle
 * ships this library under OpenBLAS's file name instead (packaging/hearth.spec, NUMPY_BLAS): it defines the 57
 * symbols numpy's extension modules import (scipy_cblas_*64_, scipy_*_64_) and forwards them to MKL's ILP64
 * Fortran interface (sgemm_64, dgesdd_64, ...), found through its RPATH in ../torch/lib.
 *
 * - LAPACK routines and ?copy that libtorch_cpu.so exports: a jump to the same routine (same arguments).
 * - ?gesv, which it does not export: ?getrf then ?getrs, as LAPACK's reference ?gesv does.
 * - cblas ?gemm and real ?gemv: the Fortran routine, row-major calls turned into column-major ones as the
 *   reference CBLAS does (the transposed problem); ?syrk: ?gemm of A with itself (both triangles are written;
 *   numpy copies one over the other); real ?dot and ?axpy: the Fortran routine.
 * - complex ?gemv and ?dot*_sub: plain loops (libtorch_cpu.so exports no complex gemv, and the Fortran complex
 *   dots return their value in a compiler-specific way).
 * tests/test_packaging.py runs numpy's linear algebra over it against the results of numpy's own OpenBLAS.
 */
#include <complex.h>
#include <stdint.h>

typedef int64_t blasint;
enum { ROW_MAJOR = 101, COL_MAJOR = 102 };
enum { NO_TRANS = 111, TRANS = 112, CONJ_TRANS = 113 };

/* --- routines taken as they are ------------------------------------------------------------------------------ */
#define JUMP(name)                                                                                               \
    __asm__(".globl scipy_" #name "_64_\n.type scipy_" #name "_64_, @function\nscipy_" #name "_64_:\n"           \
            "    jmp " #name "_64@PLT\n.size scipy_" #name "_64_, .-scipy_" #name "_64_\n");
#define JUMP4(stem) JUMP(s##stem) JUMP(d##stem) JUMP(c##stem) JUMP(z##stem)
JUMP4(copy)
JUMP4(getrf)
JUMP4(potrf)
JUMP4(gesdd)
JUMP4(gelsd)
JUMP4(geev)
JUMP(ssyevd)
JUMP(dsyevd)
JUMP(cheevd)
JUMP(zheevd)
JUMP(dgeqrf)
JUMP(zgeqrf)
JUMP(dorgqr)
JUMP(zungqr)

/* --- ?gesv ---------------------------------------------------------------------------------------------------- */
#define GESV(t, T)                                                                                               \
    void t##getrf_64(const blasint *, const blasint *, T *, const blasint *, blasint *, blasint *);                                           \
    void t##getrs_64(const char *, const blasint *, const blasint *, const T *, const blasint *, const blasint *, T *, const blasint *, blasint *); \
    void scipy_##t##gesv_64_(const blasint *n, const blasint *nrhs, T *a, const blasint *lda, blasint *ipiv, T *b, const blasint *ldb,        \
                             blasint *info) {                                                                         \
        t##getrf_64(n, n, a, lda, ipiv, info);                                                                  \
        if (*info == 0) t##getrs_64("N", n, nrhs, a, lda, ipiv, b, ldb, info);                                  \
    }
GESV(s, float)
GESV(d, double)
GESV(c, float complex)
GESV(z, double complex)

/* --- cblas ---------------------------------------------------------------------------------------------------- */
static const char *trans_char(int trans) { return trans == NO_TRANS ? "N" : trans == TRANS ? "T" : "C"; }

/* gemm for all four types: alpha and beta by address (the Fortran convention). */
#define GEMM_ADDR(t, T)                                                                                          \
    void t##gemm_64(const char *, const char *, const blasint *, const blasint *, const blasint *, const T *, const T *, const blasint *, \
                    const T *, const blasint *, const T *, T *, const blasint *);                                           \
    static void t##gemm_cblas(int order, int ta, int tb, blasint m, blasint n, blasint k, const T *alpha, const T *a, blasint lda,      \
                              const T *b, blasint ldb, const T *beta, T *c, blasint ldc) {                                  \
        if (order == COL_MAJOR)                                                                                 \
            t##gemm_64(trans_char(ta), trans_char(tb), &m, &n, &k, alpha, a, &lda, b, &ldb, beta, c, &ldc);     \
        else /* C^T = op(B)^T op(A)^T, column-major */                                                          \
            t##gemm_64(trans_char(tb), trans_char(ta), &n, &m, &k, alpha, b, &ldb, a, &lda, beta, c, &ldc);     \
    }
GEMM_ADDR(s, float)
GEMM_ADDR(d, double)
GEMM_ADDR(c, float complex)
GEMM_ADDR(z, double complex)

#define GEMM_SYRK_REAL(t, T)                                                                                     \
    void scipy_cblas_##t##gemm64_(int order, int ta, int tb, blasint m, blasint n, blasint k, T alpha, const T *a, blasint lda,         \
                                  const T *b, blasint ldb, T beta, T *c, blasint ldc) {                                     \
        t##gemm_cblas(order, ta, tb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);                           \
    }                                                                                                           \
    void scipy_cblas_##t##syrk64_(int order, int uplo, int trans, blasint n, blasint k, T alpha, const T *a, blasint lda, T beta, \
                                  T *c, blasint ldc) {                                                                \
        (void)uplo;                                                                                             \
        if (trans == NO_TRANS)                                                                                  \
            t##gemm_cblas(order, NO_TRANS, TRANS, n, n, k, &alpha, a, lda, a, lda, &beta, c, ldc);              \
        else                                                                                                    \
            t##gemm_cblas(order, TRANS, NO_TRANS, n, n, k, &alpha, a, lda, a, lda, &beta, c, ldc);              \
    }
GEMM_SYRK_REAL(s, float)
GEMM_SYRK_REAL(d, double)

#define GEMM_SYRK_COMPLEX(t, T)                                                                                  \
    void scipy_cblas_##t##gemm64_(int order, int ta, int tb, blasint m, blasint n, blasint k, const void *alpha, const void *a,   \
                                  blasint lda, const void *b, blasint ldb, const void *beta, void *c, blasint ldc) {              \
        t##gemm_cblas(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);                             \
    }                                                                                                           \
    void scipy_cblas_##t##syrk64_(int order, int uplo, int trans, blasint n, blasint k, const void *alpha, const void *a,   \
                                  blasint lda, const void *beta, void *c, blasint ldc) {                                    \
        (void)uplo;                                                                                             \
        if (trans == NO_TRANS)                                                                                  \
            t##gemm_cblas(order, NO_TRANS, TRANS, n, n, k, alpha, a, lda, a, lda, beta, c, ldc);                \
        else                                                                                                    \
            t##gemm_cblas(order, TRANS, NO_TRANS, n, n, k, alpha, a, lda, a, lda, beta, c, ldc);                \
    }
GEMM_SYRK_COMPLEX(c, float complex)
GEMM_SYRK_COMPLEX(z, double complex)

#define REAL_VECTOR(t, T)                                                                                        \
    void t##gemv_64(const char *, const blasint *, const blasint *, const T *, const T *, const blasint *, const T *, const blasint *,  \
                    const T *, T *, const blasint *);                                                                 \
    T t##dot_64(const blasint *, const T *, const blasint *, const T *, const blasint *);                                         \
    void t##axpy_64(const blasint *, const T *, const T *, const blasint *, T *, const blasint *);                                \
    void scipy_cblas_##t##gemv64_(int order, int trans, blasint m, blasint n, T alpha, const T *a, blasint lda, const T *x,       \
                                  blasint incx, T beta, T *y, blasint incy) {                                               \
        if (order == COL_MAJOR)                                                                                 \
            t##gemv_64(trans_char(trans), &m, &n, &alpha, a, &lda, x, &incx, &beta, y, &incy);                  \
        else /* a row-major A is the column-major A^T */                                                        \
            t##gemv_64(trans == NO_TRANS ? "T" : "N", &n, &m, &alpha, a, &lda, x, &incx, &beta, y, &incy);      \
    }                                                                                                           \
    T scipy_cblas_##t##dot64_(blasint n, const T *x, blasint incx, const T *y, blasint incy) {                                    \
        return t##dot_64(&n, x, &incx, y, &incy);                                                               \
    }                                                                                                           \
    void scipy_cblas_##t##axpy64_(blasint n, T alpha, const T *x, blasint incx, T *y, blasint incy) {                             \
        t##axpy_64(&n, &alpha, x, &incx, y, &incy);                                                             \
    }
REAL_VECTOR(s, float)
REAL_VECTOR(d, double)

/* BLAS's start index of a vector of n elements with stride inc (a negative stride runs from the end). */
static blasint start(blasint n, blasint inc) { return inc >= 0 ? 0 : (1 - n) * inc; }

#define COMPLEX_VECTOR(t, T)                                                                                     \
    void t##axpy_64(const blasint *, const T *, const T *, const blasint *, T *, const blasint *);                                \
    void scipy_cblas_##t##axpy64_(blasint n, const void *alpha, const void *x, blasint incx, void *y, blasint incy) {             \
        t##axpy_64(&n, alpha, x, &incx, y, &incy);                                                              \
    }                                                                                                           \
    static T t##dot(blasint n, const T *x, blasint incx, const T *y, blasint incy, int conjugate) {                               \
        T sum = 0;                                                                                              \
        for (blasint i = 0, ix = start(n, incx), iy = start(n, incy); i < n; i++, ix += incx, iy += incy)             \
            sum += (conjugate ? conj(x[ix]) : x[ix]) * y[iy];                                                   \
        return sum;                                                                                             \
    }                                                                                                           \
    void scipy_cblas_##t##dotc_sub64_(blasint n, const void *x, blasint incx, const void *y, blasint incy, void *ret) {           \
        *(T *)ret = n > 0 ? t##dot(n, x, incx, y, incy, 1) : 0;                                                 \
    }                                                                                                           \
    void scipy_cblas_##t##dotu_sub64_(blasint n, const void *x, blasint incx, const void *y, blasint incy, void *ret) {           \
        *(T *)ret = n > 0 ? t##dot(n, x, incx, y, incy, 0) : 0;                                                 \
    }                                                                                                           \
    /* y := alpha op(A) x + beta y, y not read when beta is 0 (as BLAS) */                                      \
    void scipy_cblas_##t##gemv64_(int order, int trans, blasint m, blasint n, const void *alpha_, const void *a_, blasint lda,    \
                                  const void *x_, blasint incx, const void *beta_, void *y_, blasint incy) {                \
        const T alpha = *(const T *)alpha_, beta = *(const T *)beta_, *a = a_, *x = x_;                         \
        T *y = y_;                                                                                              \
        blasint leny = trans == NO_TRANS ? m : n, lenx = trans == NO_TRANS ? n : m;                                   \
        if (m <= 0 || n <= 0 || (alpha == 0 && beta == 1)) return;                                              \
        for (blasint r = 0, iy = start(leny, incy); r < leny; r++, iy += incy) {                                      \
            T sum = 0;                                                                                          \
            if (alpha != 0)                                                                                     \
                for (blasint c = 0, ix = start(lenx, incx); c < lenx; c++, ix += incx) {                              \
                    blasint i = trans == NO_TRANS ? r : c, j = trans == NO_TRANS ? c : r; /* element A(i, j) */       \
                    T aij = order == ROW_MAJOR ? a[i * lda + j] : a[i + j * lda];                               \
                    sum += (trans == CONJ_TRANS ? conj(aij) : aij) * x[ix];                                     \
                }                                                                                               \
            y[iy] = alpha * sum + (beta == 0 ? 0 : beta * y[iy]);                                               \
        }                                                                                                       \
    }
COMPLEX_VECTOR(c, float complex)
COMPLEX_VECTOR(z, double complex)
