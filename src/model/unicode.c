/* unicode.c - UTF-8 and category lookups over the generated range table. */
#include "model/unicode.h"

uint32_t si_utf8_decode(const char *s, size_t len, size_t *n)
{
    const uint8_t *p = (const uint8_t *)s;
    uint32_t c = p[0];
    *n = 1;
    if (c < 0x80)
        return c;
    size_t need;
    uint32_t min;
    if ((c & 0xe0) == 0xc0) {
        need = 2;
        min = 0x80;
        c &= 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        need = 3;
        min = 0x800;
        c &= 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        need = 4;
        min = 0x10000;
        c &= 0x07;
    } else {
        return SI_UTF8_INVALID;
    }
    if (len < need)
        return SI_UTF8_INVALID;
    for (size_t i = 1; i < need; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return SI_UTF8_INVALID;
        c = c << 6 | (p[i] & 0x3f);
    }
    /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF are
     * not valid UTF-8. */
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return SI_UTF8_INVALID;
    *n = need;
    return c;
}

size_t si_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Classes of the ASCII code points without the binary search; the tests
 * check them against the generated table. */
static unsigned ascii_class(uint32_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return SI_UCAT_LETTER;
    if (c >= '0' && c <= '9')
        return SI_UCAT_NUMBER;
    if (c == ' ')
        return SI_UCAT_SEPARATOR | SI_UFLAG_SPACE;
    if (c >= 0x09 && c <= 0x0d)
        return SI_UCAT_OTHER | SI_UFLAG_SPACE;
    if (c < 0x20 || c == 0x7f)
        return SI_UCAT_OTHER;
    if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '`' ||
        c == '|' || c == '~')
        return SI_UCAT_SYMBOL;
    return SI_UCAT_PUNCT;
}

unsigned si_unicode_class(uint32_t cp)
{
    if (cp < 0x80)
        return ascii_class(cp);
    if (cp > 0x10ffff)
        return SI_UCAT_OTHER;
    /* The last range starting at or before cp. */
    size_t lo = 0, hi = si__unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (si__unicode_ranges[mid] >> 8 <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return si__unicode_ranges[lo] & 0xffu;
}

const char *si_unicode_version(void)
{
    return si__unicode_version;
}
