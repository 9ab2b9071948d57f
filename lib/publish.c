/* Publishing events (publish.h). */
#include "publish.h"

#include <stdlib.h>

#include "error.h"

/* Set once at startup, before publishing threads exist (publish.h). */
static const char *signer_name;
static const sp_sign_key_t *signer_key;

void sp_publish_signer_set(const char *identity, const sp_sign_key_t *key)
{
    signer_name = key ? identity : NULL;
    signer_key = key;
}

const char *sp_publish_signer(void)
{
    return signer_name;
}

int sp_publish_pack(sp_envelope_t *env, uint8_t **ret_buf, size_t *ret_len)
{
    if (signer_key)
        return sp_envelope_encode_signed(env, signer_name, signer_key, ret_buf, ret_len);
    return sp_envelope_encode(env, ret_buf, ret_len);
}

int sp_publish_encode(sp_envelope_t *env, char id_buf[37], const char *worker,
                      char subject[SP_PUBLISH_SUBJECT_MAX], uint8_t **ret_buf, size_t *ret_len)
{
    int rc;

    sp_envelope_stamp(env, id_buf);
    if ((rc = sp_envelope_subject(env, worker, subject, SP_PUBLISH_SUBJECT_MAX)) < 0)
        return rc;
    return sp_publish_pack(env, ret_buf, ret_len);
}

int sp_publish_event(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker,
                     const char *msg_id, uint64_t *ret_seq)
{
    char subject[SP_PUBLISH_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;

    if ((rc = sp_publish_encode(env, id_buf, worker, subject, &buf, &len)) < 0)
        return rc;
    rc = sp_bus_publish(bus, subject, buf, len, msg_id ? msg_id : env->event_id, ret_seq, NULL);
    free(buf);
    return rc;
}

int sp_publish_event_async(sp_bus_t *bus, sp_envelope_t *env, char id_buf[37], const char *worker)
{
    char subject[SP_PUBLISH_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc;

    if ((rc = sp_publish_encode(env, id_buf, worker, subject, &buf, &len)) < 0)
        return rc;
    rc = sp_bus_publish_async(bus, subject, buf, len, env->event_id);
    free(buf);
    return rc;
}

void sp_envelope_answer(sp_envelope_t *env, Space__V1__Aggregate *agg, const sp_envelope_t *cause,
                        const char *actor)
{
    space__v1__envelope__init(env);
    space__v1__aggregate__init(agg);
    agg->kind = cause->aggregate->kind;
    agg->id = cause->aggregate->id;
    env->aggregate = agg;
    env->tenant = cause->tenant;
    env->actor = (char *)actor;
    env->correlation_id = cause->correlation_id;
    env->causation_id = cause->event_id;
}
