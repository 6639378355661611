#ifndef FSCHED_STUB_MATH_H
#define FSCHED_STUB_MATH_H
#include "_stub_types.h"
typedef float float_t;
typedef double double_t;
#define HUGE_VAL __builtin_huge_val()
#define HUGE_VALF __builtin_huge_valf()
#define HUGE_VALL __builtin_huge_vall()
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define FP_NAN 1
#define FP_INFINITE 2
#define FP_ZERO 3
#define FP_NORMAL 4
#define FP_SUBNORMAL 5
#define FP_ILOGB0 (-2147483647 - 1)
#define FP_ILOGBNAN (-2147483647 - 1)
#define MATH_ERRNO 1
#define MATH_ERREXCEPT 2
#define math_errhandling MATH_ERREXCEPT
#define fpclassify(x) __builtin_fpclassify(FP_NAN, FP_INFINITE, FP_NORMAL, FP_SUBNORMAL, FP_ZERO, x)
#define signbit(x) __builtin_signbit(x)
#define isfinite(x) __builtin_isfinite(x)
#define isinf(x) __builtin_isinf(x)
#define isnan(x) __builtin_isnan(x)
#define isnormal(x) __builtin_isnormal(x)
#define isgreater(x, y) __builtin_isgreater(x, y)
#define isgreaterequal(x, y) __builtin_isgreaterequal(x, y)
#define isless(x, y) __builtin_isless(x, y)
#define islessequal(x, y) __builtin_islessequal(x, y)
#define islessgreater(x, y) __builtin_islessgreater(x, y)
#define isunordered(x, y) __builtin_isunordered(x, y)
#define FSCHED_STUB_MATH1(n) double n(double); float n##f(float); long double n##l(long double);
#define FSCHED_STUB_MATH2(n) double n(double, double); float n##f(float, float); long double n##l(long double, long double);
FSCHED_STUB_BEGIN
FSCHED_STUB_MATH1(acos) FSCHED_STUB_MATH1(asin) FSCHED_STUB_MATH1(atan) FSCHED_STUB_MATH2(atan2)
FSCHED_STUB_MATH1(cos) FSCHED_STUB_MATH1(sin) FSCHED_STUB_MATH1(tan)
FSCHED_STUB_MATH1(acosh) FSCHED_STUB_MATH1(asinh) FSCHED_STUB_MATH1(atanh)
FSCHED_STUB_MATH1(cosh) FSCHED_STUB_MATH1(sinh) FSCHED_STUB_MATH1(tanh)
FSCHED_STUB_MATH1(exp) FSCHED_STUB_MATH1(exp2) FSCHED_STUB_MATH1(expm1)
FSCHED_STUB_MATH1(log) FSCHED_STUB_MATH1(log10) FSCHED_STUB_MATH1(log2) FSCHED_STUB_MATH1(log1p)
FSCHED_STUB_MATH1(logb) FSCHED_STUB_MATH1(cbrt) FSCHED_STUB_MATH1(fabs) FSCHED_STUB_MATH2(hypot)
FSCHED_STUB_MATH2(pow) FSCHED_STUB_MATH1(sqrt) FSCHED_STUB_MATH1(erf) FSCHED_STUB_MATH1(erfc)
FSCHED_STUB_MATH1(lgamma) FSCHED_STUB_MATH1(tgamma) FSCHED_STUB_MATH1(ceil) FSCHED_STUB_MATH1(floor)
FSCHED_STUB_MATH1(nearbyint) FSCHED_STUB_MATH1(rint) FSCHED_STUB_MATH1(round) FSCHED_STUB_MATH1(trunc)
FSCHED_STUB_MATH2(fmod) FSCHED_STUB_MATH2(remainder) FSCHED_STUB_MATH2(copysign)
FSCHED_STUB_MATH2(nextafter) FSCHED_STUB_MATH2(fdim) FSCHED_STUB_MATH2(fmax) FSCHED_STUB_MATH2(fmin)
double fma(double, double, double); float fmaf(float, float, float); long double fmal(long double, long double, long double);
double frexp(double, int*); float frexpf(float, int*); long double frexpl(long double, int*);
double ldexp(double, int); float ldexpf(float, int); long double ldexpl(long double, int);
double scalbn(double, int); float scalbnf(float, int); long double scalbnl(long double, int);
double scalbln(double, long); float scalblnf(float, long); long double scalblnl(long double, long);
double modf(double, double*); float modff(float, float*); long double modfl(long double, long double*);
int ilogb(double); int ilogbf(float); int ilogbl(long double);
long lrint(double); long lrintf(float); long lrintl(long double);
long long llrint(double); long long llrintf(float); long long llrintl(long double);
long lround(double); long lroundf(float); long lroundl(long double);
long long llround(double); long long llroundf(float); long long llroundl(long double);
double remquo(double, double, int*); float remquof(float, float, int*); long double remquol(long double, long double, int*);
double nexttoward(double, long double); float nexttowardf(float, long double); long double nexttowardl(long double, long double);
double nan(const char*); float nanf(const char*); long double nanl(const char*);
FSCHED_STUB_END
#undef FSCHED_STUB_MATH1
#undef FSCHED_STUB_MATH2
#endif
