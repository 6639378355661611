#ifndef FSCHED_STUB_LOCALE_H
#define FSCHED_STUB_LOCALE_H
#include "_stub_types.h"
struct lconv {
    char* decimal_point;
    char* thousands_sep;
    char* grouping;
    char* int_curr_symbol;
    char* currency_symbol;
    char* mon_decimal_point;
    char* mon_thousands_sep;
    char* mon_grouping;
    char* positive_sign;
    char* negative_sign;
    char int_frac_digits, frac_digits, p_cs_precedes, p_sep_by_space, n_cs_precedes,
        n_sep_by_space, p_sign_posn, n_sign_posn, int_p_cs_precedes, int_n_cs_precedes,
        int_p_sep_by_space, int_n_sep_by_space, int_p_sign_posn, int_n_sign_posn;
};
#define LC_ALL 0
#define LC_COLLATE 1
#define LC_CTYPE 2
#define LC_MONETARY 3
#define LC_NUMERIC 4
#define LC_TIME 5
#define LC_MESSAGES 6
FSCHED_STUB_BEGIN
char* setlocale(int, const char*);
struct lconv* localeconv(void);
FSCHED_STUB_END
#endif
