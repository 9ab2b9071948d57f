/* Envelope -> JSON, driven by the protobuf-c descriptors so that every event type, present and
 * future, renders without a hand-written case (used by space-replay and the SSE streams). */
#include <inttypes.h>
#include <string.h>

#include "buf.h"
#include "envelope.h"

static void message_json(sp_buf_t *b, const ProtobufCMessage *m);

static void scalar_json(sp_buf_t *b, const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        sp_buf_printf(b, "%" PRId32, *(const int32_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        sp_buf_printf(b, "%" PRIu32, *(const uint32_t *)p);
        break;
    /* 64-bit integers as numbers: our values (sizes, microseconds) stay below 2^53. */
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        sp_buf_printf(b, "%" PRId64, *(const int64_t *)p);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        sp_buf_printf(b, "%" PRIu64, *(const uint64_t *)p);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        sp_buf_puts(b, *(const protobuf_c_boolean *)p ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        if (v)
            sp_buf_json_str(b, v->name);
        else
            sp_buf_printf(b, "%d", *(const int *)p);
        break;
    }
    case PROTOBUF_C_TYPE_FLOAT:
        sp_buf_printf(b, "%.9g", (double)*(const float *)p);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        sp_buf_printf(b, "%.17g", *(const double *)p);
        break;
    case PROTOBUF_C_TYPE_STRING:
        sp_buf_json_str(b, *(char *const *)p);
        break;
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *d = p;
        sp_buf_putc(b, '"');
        sp_buf_hex(b, d->data, d->len);
        sp_buf_putc(b, '"');
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        if (sub)
            message_json(b, sub);
        else
            sp_buf_puts(b, "null");
        break;
    }
    }
}

static size_t elem_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

static void message_json(sp_buf_t *b, const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    int first = 1;

    sp_buf_putc(b, '{');
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *member = base + f->offset;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            /* Only the case that is set. */
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
        }
        if (!first)
            sp_buf_putc(b, ',');
        first = 0;
        sp_buf_json_str(b, f->name);
        sp_buf_putc(b, ':');
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)member;
            sp_buf_putc(b, '[');
            for (size_t k = 0; k < n; k++) {
                if (k)
                    sp_buf_putc(b, ',');
                scalar_json(b, f, arr + k * elem_size(f));
            }
            sp_buf_putc(b, ']');
        } else {
            scalar_json(b, f, member);
        }
    }
    sp_buf_putc(b, '}');
}

void sp_envelope_to_json(const sp_envelope_t *env, sp_buf_t *out)
{
    message_json(out, &env->base);
}
