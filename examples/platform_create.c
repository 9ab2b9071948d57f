/* platform_create: an internal platform asks SPACE-C for a sandbox over the bus
 * (docs/platforms.md). Copy it; it is built with the project against libspace.
 *
 *   platform_create NATS_URL CREDS_DIR NAME TENANT TEMPLATE
 *
 * CREDS_DIR holds what `space platform add NAME --tenants TENANT` made for platform-NAME:
 * platform-NAME.nk (NATS login seed, 0600), .nkpub (its public key) and .key (the Ed25519 key
 * the intent is signed with, 0600). Prints the sandbox id and the intent's event id; the
 * outcome (SandboxStarted or SandboxRequestRejected) is followed on the HTTP API:
 * GET /v1/sandboxes/ID/events with an API key of TENANT. Exit 0 published, 1 failed, 2 the
 * intent check refused it before anything was sent. */
#include <stdio.h>
#include <stdlib.h>

#include "busid.h"
#include "error.h"
#include "ids.h"
#include "intent.h"
#include "publish.h"

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s NATS_URL CREDS_DIR NAME TENANT TEMPLATE\n", argv[0]);
        return 2;
    }
    const char *url = argv[1], *creds = argv[2], *name = argv[3], *tenant = argv[4];
    char identity[SP_IDENTITY_MAX + 1], err[SP_BUSID_ERR_MAX], reason[SP_REASON_MAX];
    char sandbox[SP_SANDBOX_ID_LEN + 1], event_id[37], subject[SP_PUBLISH_SUBJECT_MAX];
    sp_bus_opts_t bo = {.url = url, .name = "platform-example", .timeout_ms = 5000};
    sp_busid_t id = {0};
    sp_bus_t *bus = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t seq = 0;
    const char *code = NULL;
    int rc, exit_code = 1;

    /* 1. The identity: NATS user (NKey) and signing key. From here on sp_publish_pack signs
     *    every envelope as platform-NAME. */
    snprintf(identity, sizeof(identity), "platform-%s", name);
    if (sp_busid_setup(creds, identity, NULL, &id, &bo, err) < 0) {
        fprintf(stderr, "credentials: %s\n", err);
        return 1;
    }
    if ((rc = sp_bus_connect(&bo, &bus)) < 0) {
        fprintf(stderr, "connect %s: %s\n", url, sp_strerror(rc));
        goto out;
    }

    /* 2. The intent. The sandbox id is the platform's to choose (a fresh one: "sbx_" + UUIDv7);
     *    actor is who asked (here the platform itself; a real one puts its user). No network
     *    policy means deny_all; no env: platforms have no data plane to carry the values. */
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__SandboxCreateRequested create = SPACE__V1__SANDBOX_CREATE_REQUESTED__INIT;
    sp_sandbox_id_new(sandbox);
    agg.kind = "sandbox";
    agg.id = sandbox;
    create.template_ = argv[5];
    create.timeout_s = 300;
    env.aggregate = &agg;
    env.tenant = (char *)tenant;
    env.actor = identity;
    env.correlation_id = event_id; /* your request id, to find the intent again */
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    env.sandbox_create_requested = &create;
    sp_envelope_stamp(&env, event_id); /* event_id, occurred_at, schema_version, type */
    env.signer = identity;

    /* 3. The check the scheduler applies: refusing here saves a round trip. */
    if (sp_intent_check(&env, reason, &code) < 0) {
        fprintf(stderr, "refused before publishing: %s: %s\n", code, reason);
        exit_code = 2;
        goto out;
    }

    /* 4. Sign and publish on the scheduler's subject, space.ev.sbx._.<sandbox>.<type> (the
     *    only one the platform may use), with the event id as Nats-Msg-Id: a retry within the
     *    stream's duplicate window is stored once. */
    if ((rc = sp_envelope_subject(&env, NULL, subject, sizeof(subject))) < 0 ||
        (rc = sp_publish_pack(&env, &buf, &len)) < 0 ||
        (rc = sp_bus_publish(bus, subject, buf, len, event_id, &seq, NULL)) < 0) {
        fprintf(stderr, "publish: %s\n", sp_strerror(rc));
        goto out;
    }
    printf("sandbox %s\nevent %s (stream seq %llu)\n", sandbox, event_id, (unsigned long long)seq);
    exit_code = 0;
out:
    free(buf);
    sp_bus_free(bus);
    sp_busid_dispose(&id);
    return exit_code;
}
