/* Text validation (text.h). */
#include "text.h"

/* Valid UTF-8 without control characters (C0, DEL): what may appear in any text field, so a
 * field can be logged, put into JSON and shown in a terminal without surprises. Scripts
 * (a command line, its arguments) may also hold newlines and tabs. */
bool sp_text_valid(const char *s, size_t max, unsigned flags)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = 0;
    while (*p) {
        unsigned c = *p;
        int extra;
        if ((c < 0x20 || c == 0x7f) &&
            !((flags & SP_TEXT_SPACE_CONTROLS) && (c == '\n' || c == '\t' || c == '\r')))
            return false;
        if (c < 0x80)
            extra = 0;
        else if (c >= 0xc2 && c <= 0xdf)
            extra = 1;
        else if (c >= 0xe0 && c <= 0xef)
            extra = 2;
        else if (c >= 0xf0 && c <= 0xf4)
            extra = 3;
        else
            return false;
        unsigned cp = extra == 0 ? c : c & (0x3fu >> extra);
        p++;
        n++;
        for (int i = 0; i < extra; i++, p++, n++) {
            if ((*p & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (*p & 0x3fu);
        }
        /* Overlong forms, surrogates and code points past U+10FFFF. */
        if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        if (n > max)
            return false;
    }
    return true;
}
