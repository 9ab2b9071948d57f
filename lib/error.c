/* Error strings for SP_E* codes and negative errnos. */
#include "error.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char *const sp_messages[] = {
    [SP_ETOOBIG - SP_EFIRST] = "input larger than its limit",
    [SP_EDECODE - SP_EFIRST] = "not a valid protobuf message",
    [SP_ESCHEMA - SP_EFIRST] = "message does not match the schema",
    [SP_ETYPE - SP_EFIRST] = "unknown event type or type/payload mismatch",
    [SP_EVERSION - SP_EFIRST] = "unsupported schema version",
    [SP_ETRANSITION - SP_EFIRST] = "illegal state transition",
    [SP_EBUS - SP_EFIRST] = "message bus failure",
    [SP_EDB - SP_EFIRST] = "database failure",
    [SP_ETIMEOUT - SP_EFIRST] = "operation timed out",
    [SP_ECONFIG - SP_EFIRST] = "bad configuration value",
    [SP_ENOTFOUND - SP_EFIRST] = "not found",
    [SP_ECHAIN - SP_EFIRST] = "hash chain broken",
    [SP_EUNSIGNED - SP_EFIRST] = "unsigned envelope",
    [SP_ESIGNER - SP_EFIRST] = "unknown signer",
    [SP_ESIGNATURE - SP_EFIRST] = "bad signature",
    [SP_ENOTALLOWED - SP_EFIRST] = "signer may not emit this event type",
    [SP_ENOTOWN - SP_EFIRST] = "not the signer's own subject or sandbox",
    [SP_ETENANT - SP_EFIRST] = "tenant not among the signer's tenants",
    [SP_ESTALE - SP_EFIRST] = "request outside its time window or replayed",
    [SP_EHEADED - SP_EFIRST] = "signed through the head of its batch",
};

_Static_assert(sizeof(sp_messages) / sizeof(sp_messages[0]) == SP_ELAST - SP_EFIRST,
               "every SP_E* code needs a message");

/* Big enough for any glibc message and for "unknown error -2147483648". */
static _Thread_local char errbuf[128];

const char *sp_strerror(int err)
{
    if (err == 0)
        return "success";
    if (err >= SP_EFIRST && err < SP_ELAST)
        return sp_messages[err - SP_EFIRST];
    /* Negating INT_MIN is undefined; positive values are not errors we hand out. */
    if (err > 0 || err == INT_MIN) {
        snprintf(errbuf, sizeof(errbuf), "unknown error %d", err);
        return errbuf;
    }
    /* GNU strerror_r (we build with _GNU_SOURCE) returns either errbuf or a static string. */
    return strerror_r(-err, errbuf, sizeof(errbuf));
}
