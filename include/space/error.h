/* Error codes shared by every libspace call.
 *
 * A call that can fail returns int: >= 0 on success, < 0 on failure, either a negative errno
 * (-ENOMEM, -EINVAL, ...) or one of the SP_E* codes below, which live far below any errno.
 */
#ifndef SPACE_ERROR_H
#define SPACE_ERROR_H

enum {
    SP_EFIRST = -100000,
    SP_ETOOBIG = SP_EFIRST, /* input larger than its limit */
    SP_EDECODE,             /* bytes are not a valid protobuf message */
    SP_ESCHEMA,             /* decoded, but a field is missing, too long or malformed */
    SP_ETYPE,               /* unknown event type or type/payload mismatch */
    SP_EVERSION,            /* unsupported schema_version */
    SP_ETRANSITION,         /* illegal state machine transition */
    SP_EBUS,                /* NATS / JetStream failure */
    SP_EDB,                 /* PostgreSQL failure */
    SP_ETIMEOUT,            /* an operation did not finish in time */
    SP_ECONFIG,             /* bad configuration value */
    SP_ENOTFOUND,           /* the thing asked for does not exist */
    SP_ECHAIN,              /* hash chain broken */
    /* Trust refusals (contract.h, docs/trust.md): why a message is not acted on. */
    SP_EUNSIGNED,   /* the envelope carries no signer or no signature */
    SP_ESIGNER,     /* the signer is not a known identity */
    SP_ESIGNATURE,  /* the signature does not verify over the canonical bytes */
    SP_ENOTALLOWED, /* the signer's kind may not emit this event type */
    SP_ENOTOWN,     /* subject, aggregate or sandbox is not the signer's own */
    SP_ETENANT,     /* a platform signed for a tenant that is not among its tenants */
    SP_ESTALE,      /* a signed request outside its time window, or seen before (replayed) */
    SP_EHEADED,     /* a headed batch member: verifiable only against its head (sign.h) */
    SP_ELAST
};

/* Returns a human-readable string for err (an SP_E* code or a negative errno). It is static, or
 * for an errno lives in a thread-local buffer until the next call from the same thread. */
const char *sp_strerror(int err);

#endif
