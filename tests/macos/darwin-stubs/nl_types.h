#ifndef FSCHED_STUB_NL_TYPES_H
#define FSCHED_STUB_NL_TYPES_H
#include "_stub_types.h"
typedef struct __nl_cat_d* nl_catd;
typedef int nl_item;
#define NL_CAT_LOCALE 1
FSCHED_STUB_BEGIN
nl_catd catopen(const char*, int);
char* catgets(nl_catd, int, int, const char*);
int catclose(nl_catd);
FSCHED_STUB_END
#endif
