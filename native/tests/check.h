/* The checks of the native test programs: a failed check is counted and printed, and the
 * program goes on, so one run reports every failure (each program prints the totals and
 * exits 1 when any check failed: run_tests). Included by one translation unit per program. */
#ifndef SKIPPY_TESTS_CHECK_H
#define SKIPPY_TESTS_CHECK_H

#include <stddef.h>
#include <stdio.h>

static int g_failures;
static int g_checks;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        g_checks++;                                                                         \
        if (!(cond)) {                                                                      \
            g_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
        }                                                                                   \
    } while (0)

#define CHECK_EQ(a, b)                                                                      \
    do {                                                                                    \
        unsigned long long va_ = (unsigned long long)(a), vb_ = (unsigned long long)(b);    \
        g_checks++;                                                                         \
        if (va_ != vb_) {                                                                   \
            g_failures++;                                                                   \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %llu, %s == %llu\n", __FILE__,   \
                    __LINE__, #a, va_, #b, vb_);                                            \
        }                                                                                   \
    } while (0)

struct named_test {
    const char *name;
    void (*fn)(void);
};

/* Run every test, one line each, then the totals; the program's exit status. */
static int run_tests(const struct named_test *tests, size_t count) {
    for (size_t i = 0; i < count; i++) {
        int before = g_failures;
        tests[i].fn();
        printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", tests[i].name);
    }
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}

#endif /* SKIPPY_TESTS_CHECK_H */
