/* Aligned columns for the listings of the CLI (`space ls`, `space keys ls`): every column as
 * wide as its widest cell, whatever the lengths of names, ids and tenants, so a long one moves
 * the columns after it instead of pushing its own row out of line. */
#include <stdio.h>
#include <string.h>

#include "space_stack.h"

void sp__table_print(FILE *out, const char *const *cells, size_t nrows, size_t ncols)
{
    size_t w[SP_TABLE_MAX_COLS] = {0};
    if (ncols == 0 || ncols > SP_TABLE_MAX_COLS)
        return;
    for (size_t r = 0; r < nrows; r++)
        for (size_t c = 0; c < ncols; c++) {
            size_t n = strlen(cells[r * ncols + c] ? cells[r * ncols + c] : "-");
            w[c] = n > w[c] ? n : w[c];
        }
    for (size_t r = 0; r < nrows; r++)
        for (size_t c = 0; c < ncols; c++) {
            const char *s = cells[r * ncols + c] ? cells[r * ncols + c] : "-";
            if (c + 1 < ncols)
                fprintf(out, "%-*s  ", (int)w[c], s);
            else
                fprintf(out, "%s\n", s); /* the last column unpadded: no trailing blanks */
        }
}
