/* no include guard: assert.h may be included again with NDEBUG changed */
#include "_stub_types.h"
#undef assert
#ifdef NDEBUG
#define assert(e) ((void)0)
#else
FSCHED_STUB_BEGIN
__attribute__((noreturn)) void __assert_rtn(const char*, const char*, int, const char*);
FSCHED_STUB_END
#define assert(e) (__builtin_expect(!(e), 0) ? __assert_rtn(__func__, __FILE__, __LINE__, #e) : (void)0)
#endif
