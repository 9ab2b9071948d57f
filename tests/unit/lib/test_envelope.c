/* Envelope: encode/decode round trip, and every way a hostile publisher can get it wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "contract.h"
#include "envelope.h"
#include "error.h"
#include "ids.h"

typedef struct {
    sp_envelope_t env;
    Space__V1__Aggregate agg;
    Space__V1__SandboxCreateRequested create;
    Space__V1__Resources res;
    Space__V1__KeyValue kv;
    Space__V1__KeyValue *kvs[1];
    char *env_names[1];
    char id[37];
} fixture_t;

static void make_create(fixture_t *f)
{
    memset(f, 0, sizeof(*f));
    space__v1__envelope__init(&f->env);
    space__v1__aggregate__init(&f->agg);
    space__v1__sandbox_create_requested__init(&f->create);
    space__v1__resources__init(&f->res);
    space__v1__key_value__init(&f->kv);
    f->agg.kind = "sandbox";
    f->agg.id = "sbx_test0001";
    f->kv.key = "owner";
    f->kv.value = "agent \"7\"\u00e9";
    f->kvs[0] = &f->kv;
    f->env_names[0] = "OPENAI_BASE_URL";
    f->res.vcpu = 2;
    f->res.memory_mb = 512;
    f->create.template_ = "base";
    f->create.timeout_s = 300;
    f->create.n_metadata = 1;
    f->create.metadata = f->kvs;
    f->create.n_env_names = 1;
    f->create.env_names = f->env_names;
    f->create.resources = &f->res;
    f->env.aggregate = &f->agg;
    f->env.tenant = "acme";
    f->env.actor = "key_123";
    f->env.correlation_id = "req-1";
    f->env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_CREATE_REQUESTED;
    f->env.sandbox_create_requested = &f->create;
    sp_envelope_stamp(&f->env, f->id);
}

static int decode_rc(const uint8_t *buf, size_t len, char reason[SP_REASON_MAX])
{
    sp_envelope_t *e = NULL;
    int rc = sp_envelope_decode(buf, len, &e, reason);
    sp_envelope_free(e);
    return rc;
}

static void test_round_trip(void **state)
{
    fixture_t f;
    uint8_t *buf;
    size_t len;
    sp_envelope_t *e = NULL;
    char reason[SP_REASON_MAX];

    make_create(&f);
    assert_string_equal(f.env.type, "SandboxCreateRequested");
    assert_int_equal(sp_envelope_encode(&f.env, &buf, &len), 0);
    assert_int_equal(sp_envelope_decode(buf, len, &e, reason), 0);
    assert_string_equal(e->event_id, f.id);
    assert_string_equal(e->sandbox_create_requested->template_, "base");
    assert_int_equal(e->sandbox_create_requested->resources->memory_mb, 512);
    assert_string_equal(e->sandbox_create_requested->metadata[0]->value, "agent \"7\"\u00e9");

    char subj[256];
    assert_true(sp_envelope_subject(e, NULL, subj, sizeof(subj)) > 0);
    assert_string_equal(subj, "space.ev.sbx._.sbx_test0001.SandboxCreateRequested");
    assert_int_equal(sp_envelope_check_subject(e, subj, reason), 0);
    assert_int_equal(
        sp_envelope_check_subject(e, "space.ev.sbx.w1.sbx_test0001.SandboxCreateRequested", reason),
        0);
    /* Another sandbox's subject, another type, or junk: refused. */
    assert_int_equal(
        sp_envelope_check_subject(e, "space.ev.sbx._.sbx_other.SandboxCreateRequested", reason),
        SP_ESCHEMA);
    assert_int_equal(
        sp_envelope_check_subject(e, "space.ev.sbx._.sbx_test0001.SandboxDeleted", reason),
        SP_ESCHEMA);
    assert_int_equal(
        sp_envelope_check_subject(e, "space.ev.sbx.W*.sbx_test0001.SandboxCreateRequested", reason),
        SP_ESCHEMA);
    sp_envelope_free(e);
    free(buf);
}

static void test_truncated_and_garbage(void **state)
{
    fixture_t f;
    uint8_t *buf;
    size_t len;
    char reason[SP_REASON_MAX];

    make_create(&f);
    assert_int_equal(sp_envelope_encode(&f.env, &buf, &len), 0);
    /* Every strict prefix is either undecodable or fails validation: never accepted. */
    for (size_t n = 0; n < len; n++)
        assert_true(decode_rc(buf, n, reason) < 0);
    uint8_t junk[64];
    memset(junk, 0xff, sizeof(junk));
    assert_int_equal(decode_rc(junk, sizeof(junk), reason), SP_EDECODE);
    free(buf);
}

static void test_oversized(void **state)
{
    size_t n = SP_ENVELOPE_MAX + 1;
    uint8_t *big = calloc(1, n);
    char reason[SP_REASON_MAX];
    assert_int_equal(decode_rc(big, n, reason), SP_ETOOBIG);
    assert_non_null(strstr(reason, "exceeds"));
    free(big);
}

/* Encodes the fixture with extra wire records appended, decodes, and returns the result. */
static int decode_with(const uint8_t *extra, size_t n, char reason[SP_REASON_MAX], int *pb_ok)
{
    fixture_t f;
    uint8_t *buf, all[1024];
    size_t len;

    make_create(&f);
    assert_int_equal(sp_envelope_encode(&f.env, &buf, &len), 0);
    assert_true(len + n <= sizeof(all));
    memcpy(all, buf, len);
    memcpy(all + len, extra, n);
    free(buf);
    sp_envelope_t *raw = space__v1__envelope__unpack(NULL, len + n, all);
    *pb_ok = raw != NULL;
    if (raw)
        space__v1__envelope__free_unpacked(raw, NULL);
    reason[0] = '\0';
    return decode_rc(all, len + n, reason);
}

/* What protobuf-c accepts but cannot give back is refused (the fuzzer found the first: a
 * field numbered 0 under a non-minimal key); fields this build does not know still pass. */
static void test_wire_forms(void **state)
{
    char reason[SP_REASON_MAX];
    int pb_ok;

    static const uint8_t field0[] = {0x82, 0x00, 0x00}; /* key 0|LEN as 2 bytes, empty */
    assert_int_equal(decode_with(field0, sizeof(field0), reason, &pb_ok), SP_EDECODE);
    assert_true(pb_ok); /* protobuf-c alone lets it through */
    assert_non_null(strstr(reason, "field number 0"));

    static const uint8_t nul_tenant[] = {0x22, 0x03, 'a', 0x00, 'b'}; /* tenant = "a\0b" */
    assert_int_equal(decode_with(nul_tenant, sizeof(nul_tenant), reason, &pb_ok), SP_EDECODE);
    assert_true(pb_ok);
    assert_non_null(strstr(reason, "Envelope.tenant"));

    /* Inside the payload (field 100, merged into it): template = "b\0se". */
    static const uint8_t nul_nested[] = {0xa2, 0x06, 0x06, 0x0a, 0x04, 'b', 0x00, 's', 'e'};
    assert_int_equal(decode_with(nul_nested, sizeof(nul_nested), reason, &pb_ok), SP_EDECODE);
    assert_true(pb_ok);
    assert_non_null(strstr(reason, "SandboxCreateRequested.template"));

    static const uint8_t unknown[] = {0xfa, 0x07, 0x02, 'o', 'k'}; /* field 127, LEN */
    assert_int_equal(decode_with(unknown, sizeof(unknown), reason, &pb_ok), 0);
}

static void expect_invalid(fixture_t *f, int want, const char *needle)
{
    char reason[SP_REASON_MAX] = "";
    assert_int_equal(sp_envelope_validate(&f->env, reason), want);
    if (!strstr(reason, needle))
        fail_msg("reason '%s' lacks '%s'", reason, needle);
}

static void test_field_validation(void **state)
{
    fixture_t f;

    make_create(&f);
    f.env.schema_version = 2;
    expect_invalid(&f, SP_EVERSION, "schema_version");

    make_create(&f);
    f.env.type = "SandboxNuked";
    expect_invalid(&f, SP_ETYPE, "does not match");

    make_create(&f);
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET;
    f.env.type = "SandboxNuked";
    expect_invalid(&f, SP_ETYPE, "unknown event type");

    make_create(&f);
    f.env.event_id = "not-a-uuid";
    expect_invalid(&f, SP_ESCHEMA, "event_id");

    make_create(&f);
    f.agg.id = "../../etc/passwd";
    expect_invalid(&f, SP_ESCHEMA, "aggregate.id");

    make_create(&f);
    f.agg.kind = "worker";
    expect_invalid(&f, SP_ESCHEMA, "aggregate.kind");

    make_create(&f);
    f.env.tenant = "";
    expect_invalid(&f, SP_ESCHEMA, "tenant");

    make_create(&f);
    f.env.actor = "evil\nlevel=error";
    expect_invalid(&f, SP_ESCHEMA, "actor");

    make_create(&f);
    f.env.occurred_at_us = 1;
    expect_invalid(&f, SP_ESCHEMA, "occurred_at");

    make_create(&f);
    f.kv.value = "\xc3\x28"; /* invalid UTF-8 */
    expect_invalid(&f, SP_ESCHEMA, "metadata value");

    make_create(&f);
    f.env_names[0] = "1BAD=NAME";
    expect_invalid(&f, SP_ESCHEMA, "env_names");

    /* Values (vcpu, template name, time limits) are the intent check's (test_intent.c): the
     * bus stores a well-formed create and the scheduler refuses it in the open. */
    make_create(&f);
    f.create.on_timeout = "a long on_timeout value";
    expect_invalid(&f, SP_ESCHEMA, "on_timeout");

    make_create(&f);
    f.create.template_ = "";
    expect_invalid(&f, SP_ESCHEMA, "template");
}

/* Network policies in creates and updates, and egressd's facts on their own subject. */
static void test_network(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX], subject[256];
    Space__V1__NetworkPolicy p = SPACE__V1__NETWORK_POLICY__INIT;
    char *allow[] = {"api.example.com", "*.pypi.org", "203.0.113.0/24:5432"};
    char *bad[] = {"Bad Name"};
    make_create(&f);
    p.mode = "allowlist";
    p.allow = allow;
    p.n_allow = 3;
    f.create.network = &p;
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    p.mode = "open";
    expect_invalid(&f, SP_ESCHEMA, "network.mode");
    p.mode = "allowlist";
    p.deny = bad;
    p.n_deny = 1;
    expect_invalid(&f, SP_ESCHEMA, "network.deny[0]");
    p.n_deny = 0;

    Space__V1__EgressDecision d = SPACE__V1__EGRESS_DECISION__INIT;
    Space__V1__EgressDenied den = SPACE__V1__EGRESS_DENIED__INIT;
    d.protocol = "http";
    d.name = "forbidden.test";
    d.address = "198.18.1.20";
    d.port = 80;
    d.rule = "mode:allowlist";
    d.reason = "not_allowed";
    d.count = 3;
    den.decision = &d;
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_EGRESS_DENIED;
    f.env.egress_denied = &den;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_true(sp_envelope_subject(&f.env, "worker-1", subject, sizeof(subject)) > 0);
    assert_string_equal(subject, "space.ev.egress.sbx_test0001.EgressDenied");
    assert_int_equal(sp_envelope_check_subject(&f.env, subject, reason), 0);
    assert_int_not_equal(
        sp_envelope_check_subject(&f.env, "space.ev.sbx.w1.sbx_test0001.EgressDenied", reason), 0);
    d.count = 0;
    expect_invalid(&f, SP_ESCHEMA, "decision.count");
    d.count = 1;
    d.protocol = "smtp";
    expect_invalid(&f, SP_ESCHEMA, "decision.protocol");
    d.protocol = "dns";
    d.name = "bad\x01name";
    expect_invalid(&f, SP_ESCHEMA, "decision.name");
}

static void test_type_names(void **state)
{
    assert_string_equal(sp_event_type_name(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_PLACED),
                        "SandboxPlaced");
    assert_int_equal(sp_event_type_from_name("WorkerHeartbeat"),
                     SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT);
    assert_int_equal(sp_event_type_from_name("Envelope"), SPACE__V1__ENVELOPE__PAYLOAD__NOT_SET);
    assert_null(sp_event_type_name((sp_event_type_t)9999));
    assert_true(sp_event_is_worker(SPACE__V1__ENVELOPE__PAYLOAD_WORKER_STOPPED));
    assert_false(sp_event_is_worker(SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_DELETED));
}

static void test_encode_refuses_invalid(void **state)
{
    fixture_t f;
    uint8_t *buf = NULL;
    size_t len;
    make_create(&f);
    f.env.tenant = "";
    assert_int_equal(sp_envelope_encode(&f.env, &buf, &len), SP_ESCHEMA);
    assert_null(buf);
}

/* Sealed command lines: an intent that says sealed carries no line; a CommandStarted's line
 * is a whole sealed field or none; the plaintext check names what a sealing log refuses. */
static void test_sealed_command_line(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX];
    uint8_t ct[40] = {0}, nonce[12] = {0};
    Space__V1__CommandRequested cr = SPACE__V1__COMMAND_REQUESTED__INIT;
    Space__V1__CommandStarted st = SPACE__V1__COMMAND_STARTED__INIT;
    Space__V1__CommandOutput o = SPACE__V1__COMMAND_OUTPUT__INIT;
    char *argv[] = {"echo"};
    (void)state;
    make_create(&f);
    cr.cmd_id = "cmd_1";
    cr.cmd = "echo hi";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_REQUESTED;
    f.env.command_requested = &cr;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_string_equal(sp_envelope_plaintext_content(&f.env), "command line");
    cr.sealed = true;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "sealed"));
    cr.cmd = "";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_null(sp_envelope_plaintext_content(&f.env));
    cr.argv = argv;
    cr.n_argv = 1;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    cr.sealed = false;
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);

    st.cmd_id = "cmd_1";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_STARTED;
    f.env.command_started = &st;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    st.cmdline_ciphertext = (ProtobufCBinaryData){sizeof(ct), ct};
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "cmdline_nonce"));
    st.cmdline_nonce = (ProtobufCBinaryData){sizeof(nonce), nonce};
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "cmdline_key_id"));
    st.cmdline_key_id = "0123456789abcdef";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    st.cmdline_ciphertext.len = SP_COMMAND_LINE_SEALED_MAX + 17;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_null(sp_envelope_plaintext_content(&f.env));

    o.cmd_id = "cmd_1";
    o.stream = 1;
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
    f.env.command_output = &o;
    sp_envelope_stamp(&f.env, f.id);
    assert_null(sp_envelope_plaintext_content(&f.env)); /* the truncation marker: no data */
    o.data = (ProtobufCBinaryData){2, nonce};
    assert_string_equal(sp_envelope_plaintext_content(&f.env), "command output");
}

/* A short command's CommandExited with its start and output inside: each checked as its own
 * event would be, of the same command, within the bounds; plaintext output inside counts. */
static void test_short_command_exited(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX];
    uint8_t ct[40] = {0}, nonce[12] = {0}, text[3] = "hi\n";
    static uint8_t big[SP_COMMAND_OUTPUT_CHUNK_MAX];
    Space__V1__CommandExited ex = SPACE__V1__COMMAND_EXITED__INIT;
    Space__V1__CommandStarted st = SPACE__V1__COMMAND_STARTED__INIT;
    Space__V1__CommandOutput o[SP_COMMAND_EXITED_OUTPUT_MAX + 1];
    Space__V1__CommandOutput *op[SP_COMMAND_EXITED_OUTPUT_MAX + 1];
    (void)state;
    make_create(&f);
    for (size_t i = 0; i <= SP_COMMAND_EXITED_OUTPUT_MAX; i++) {
        space__v1__command_output__init(&o[i]);
        o[i].cmd_id = "cmd_1";
        o[i].stream = 1;
        o[i].offset = i * 3;
        o[i].data = (ProtobufCBinaryData){3, text};
        op[i] = &o[i];
    }
    ex.cmd_id = "cmd_1";
    st.cmd_id = "cmd_1";
    st.pid = 7;
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_EXITED;
    f.env.command_exited = &ex;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    /* Output only with its start. */
    ex.output = op;
    ex.n_output = 1;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "only with started"));
    ex.started = &st;
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_string_equal(sp_envelope_plaintext_content(&f.env), "command output");
    /* Round trip: what the worker sends is what the log decodes. */
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(sp_envelope_encode(&f.env, &buf, &len), 0);
    sp_envelope_t *back = NULL;
    assert_int_equal(sp_envelope_decode(buf, len, &back, reason), 0);
    assert_int_equal(back->command_exited->started->pid, 7);
    assert_int_equal(back->command_exited->n_output, 1);
    assert_memory_equal(back->command_exited->output[0]->data.data, "hi\n", 3);
    sp_envelope_free(back);
    free(buf);
    /* Another command's start or output. */
    st.cmd_id = "cmd_2";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    st.cmd_id = "cmd_1";
    o[0].cmd_id = "cmd_2";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o[0].cmd_id = "cmd_1";
    /* Each entry checked as a CommandOutput: a bad stream, plaintext next to a ciphertext. */
    o[0].stream = 3;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o[0].stream = 1;
    o[0].ciphertext = (ProtobufCBinaryData){sizeof(ct), ct};
    o[0].nonce = (ProtobufCBinaryData){sizeof(nonce), nonce};
    o[0].key_id = "0123456789abcdef";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o[0].data = (ProtobufCBinaryData){0, NULL};
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_null(sp_envelope_plaintext_content(&f.env)); /* sealed */
    /* Bounds: entries, and bytes carried. */
    ex.n_output = SP_COMMAND_EXITED_OUTPUT_MAX;
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    ex.n_output = SP_COMMAND_EXITED_OUTPUT_MAX + 1;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    ex.n_output = 3;
    o[1].data = (ProtobufCBinaryData){sizeof(big), big};
    o[2].data = (ProtobufCBinaryData){sizeof(big), big};
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "at most"));
}

/* Sealed file paths: the clear paths or the sealed ones, never both; a sealed field whole. */
static void test_sealed_file_paths(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX];
    uint8_t ct[40] = {0}, nonce[12] = {0};
    Space__V1__FileMoved fm = SPACE__V1__FILE_MOVED__INIT;
    Space__V1__SealedPaths sp = SPACE__V1__SEALED_PATHS__INIT;
    (void)state;
    make_create(&f);
    fm.from = "/a";
    fm.to = "/b";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED;
    f.env.file_moved = &fm;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_string_equal(sp_envelope_plaintext_content(&f.env), "file path");
    sp.ciphertext = (ProtobufCBinaryData){sizeof(ct), ct};
    sp.nonce = (ProtobufCBinaryData){sizeof(nonce), nonce};
    sp.key_id = "0123456789abcdef";
    fm.sealed = &sp;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "clear"));
    fm.from = "";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    fm.to = "";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_null(sp_envelope_plaintext_content(&f.env));
    sp.nonce.len = 8;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "sealed.nonce"));
    sp.nonce.len = 12;
    fm.sealed = NULL;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA); /* no path at all */
}

/* File events: a path the files API would produce, a digest of 32 bytes, never content. */
/* Sealed output (docs/audit.md): ciphertext, a 12-byte nonce and a key id, never next to
 * plaintext. */
static void test_sealed_output(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX];
    uint8_t ct[40] = {0}, nonce[12] = {0}, text[4] = "abc";
    Space__V1__CommandOutput o = SPACE__V1__COMMAND_OUTPUT__INIT;
    (void)state;
    make_create(&f);
    o.cmd_id = "cmd_1";
    o.stream = 1;
    o.ciphertext = (ProtobufCBinaryData){sizeof(ct), ct};
    o.nonce = (ProtobufCBinaryData){sizeof(nonce), nonce};
    o.key_id = "0123456789abcdef";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_COMMAND_OUTPUT;
    f.env.command_output = &o;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    o.data = (ProtobufCBinaryData){3, text};
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    assert_non_null(strstr(reason, "plaintext"));
    o.data = (ProtobufCBinaryData){0, NULL};
    o.nonce.len = 11;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o.nonce.len = 12;
    o.ciphertext.len = 15;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o.ciphertext.len = sizeof(ct);
    o.key_id = "0123456789ABCDEF";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    o.key_id = "";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    /* Plaintext alone is still valid (--seal-output off). */
    o.ciphertext = (ProtobufCBinaryData){0, NULL};
    o.nonce = (ProtobufCBinaryData){0, NULL};
    o.data = (ProtobufCBinaryData){3, text};
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
}

static void test_file_events(void **state)
{
    fixture_t f;
    char reason[SP_REASON_MAX];
    uint8_t digest[32] = {1};
    Space__V1__FileWritten fw = SPACE__V1__FILE_WRITTEN__INIT;
    Space__V1__FileMoved fm = SPACE__V1__FILE_MOVED__INIT;
    (void)state;
    make_create(&f);
    fw.path = "/home/user/a.txt";
    fw.size = 5;
    fw.sha256 = (ProtobufCBinaryData){32, digest};
    fw.mode = 0644;
    fw.user = "user";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_WRITTEN;
    f.env.file_written = &fw;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    assert_string_equal(f.env.type, "FileWritten");
    /* Events inside a running sandbox have their own subjects (no worker consumer gets them),
     * and are refused on a sandbox subject. */
    char subject[256];
    assert_true(sp_envelope_subject(&f.env, "w1", subject, sizeof(subject)) > 0);
    assert_string_equal(subject, "space.ev.io.w1.sbx_test0001.FileWritten");
    assert_int_equal(sp_envelope_check_subject(&f.env, subject, reason), 0);
    assert_int_equal(
        sp_envelope_check_subject(&f.env, "space.ev.io._.sbx_test0001.FileWritten", reason), 0);
    assert_int_not_equal(
        sp_envelope_check_subject(&f.env, "space.ev.sbx.w1.sbx_test0001.FileWritten", reason), 0);
    assert_int_not_equal(
        sp_envelope_check_subject(&f.env, "space.ev.io.W*.sbx_test0001.FileWritten", reason), 0);
    fw.path = "relative";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    fw.path = "/a/../b";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    fw.path = "/a";
    fw.sha256.len = 31;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    fw.sha256.len = 32;
    fw.mode = 010000;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);

    fm.from = "/a";
    fm.to = "/b";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_FILE_MOVED;
    f.env.file_moved = &fm;
    sp_envelope_stamp(&f.env, f.id);
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    fm.to = "/b\x01";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
}

/* A heartbeat's disk numbers must be consistent: free and reserve within the total. */
static void test_heartbeat_disk(void **state)
{
    (void)state;
    sp_envelope_t env = SPACE__V1__ENVELOPE__INIT;
    Space__V1__Aggregate agg = SPACE__V1__AGGREGATE__INIT;
    Space__V1__WorkerHeartbeat hb = SPACE__V1__WORKER_HEARTBEAT__INIT;
    char id[37], reason[SP_REASON_MAX];
    agg.kind = "worker";
    agg.id = "w1";
    env.aggregate = &agg;
    env.actor = "svc:worker";
    hb.worker = "w1";
    hb.interval_ms = 1000;
    env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_WORKER_HEARTBEAT;
    env.worker_heartbeat = &hb;
    sp_envelope_stamp(&env, id);
    assert_int_equal(sp_envelope_validate(&env, reason), 0); /* no disk reported */
    hb.disk_mb_total = 20480;
    hb.disk_mb_free = 9000;
    hb.disk_mb_reserve = 1024;
    assert_int_equal(sp_envelope_validate(&env, reason), 0);
    hb.disk_mb_free = 20481;
    assert_int_equal(sp_envelope_validate(&env, reason), SP_ESCHEMA);
    hb.disk_mb_free = 9000;
    hb.disk_mb_reserve = 30000;
    assert_int_equal(sp_envelope_validate(&env, reason), SP_ESCHEMA);
}

/* Named snapshots (docs/snapshots.md): ids of their own shape, names bounded, a create names a
 * snapshot by its id only, a snapshot fact carries digests of 32 bytes. */
static void test_snapshot_events(void **state)
{
    (void)state;
    char reason[SP_REASON_MAX], snp[SP_SNAPSHOT_ID_LEN + 1];
    sp_snapshot_id_new(snp);
    assert_true(sp_snapshot_id_valid(snp));
    assert_false(sp_snapshot_id_valid("sbx_06h42friadonr92q7p2l5ps40c"));
    assert_false(sp_snapshot_id_valid("snp_../../etc"));
    fixture_t f;
    make_create(&f);
    f.create.snapshot = snp;
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    f.create.snapshot = "snp_nope";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);

    Space__V1__SandboxSnapshotRequested rq = SPACE__V1__SANDBOX_SNAPSHOT_REQUESTED__INIT;
    make_create(&f);
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOT_REQUESTED;
    f.env.sandbox_snapshot_requested = &rq;
    f.env.type = "SandboxSnapshotRequested";
    rq.snapshot_id = snp;
    rq.name = "before the upgrade";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    rq.name = "";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    rq.name = "tab\there";
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);

    Space__V1__SandboxSnapshotted sd = SPACE__V1__SANDBOX_SNAPSHOTTED__INIT;
    Space__V1__SnapshotArtifact a = SPACE__V1__SNAPSHOT_ARTIFACT__INIT, *arts[1] = {&a};
    uint8_t sha[32] = {1};
    a.name = "checkpoint.img.zst";
    a.store_key = "named/x/checkpoint.img.zst";
    a.sha256 = (ProtobufCBinaryData){32, sha};
    sd.snapshot_id = snp;
    sd.name = "n";
    sd.artifacts = arts;
    sd.n_artifacts = 1;
    sd.worker = "w1";
    sd.template_ = "tiny";
    sd.store = "dir";
    f.env.payload_case = SPACE__V1__ENVELOPE__PAYLOAD_SANDBOX_SNAPSHOTTED;
    f.env.sandbox_snapshotted = &sd;
    f.env.type = "SandboxSnapshotted";
    assert_int_equal(sp_envelope_validate(&f.env, reason), 0);
    a.sha256.len = 31;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
    a.sha256.len = 32;
    sd.n_artifacts = 0;
    assert_int_equal(sp_envelope_validate(&f.env, reason), SP_ESCHEMA);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heartbeat_disk),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_and_garbage),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_wire_forms),
        cmocka_unit_test(test_field_validation),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_encode_refuses_invalid),
        cmocka_unit_test(test_file_events),
        cmocka_unit_test(test_sealed_output),
        cmocka_unit_test(test_short_command_exited),
        cmocka_unit_test(test_sealed_command_line),
        cmocka_unit_test(test_sealed_file_paths),
        cmocka_unit_test(test_network),
        cmocka_unit_test(test_snapshot_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
