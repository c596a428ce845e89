/*
 * The least a lock in a Redis module can cost: what bench/module-floor.sh
 * measures RLOCK.ACQUIRE against, to tell the cost of the module API (paid by
 * any module) from rlock's own.
 *
 *   FLOOR.LOCK key owner PX ms        -> 1 or 0
 *   FLOOR.TOKENLOCK key owner PX ms   -> a 19-digit token or 0
 *   FLOOR.PADLOCK key owner PX ms     -> as TOKENLOCK, after PAD_LINES lines of no-ops
 *   FLOOR.REPLOCK key owner PX ms     -> as TOKENLOCK, and replicates what it stored
 *   FLOOR.APPLY key value             -> (replication only) stores a REPLOCK's value
 *
 * Each opens the key, and if it is empty stores a 48-byte value (deadline,
 * token, up to 24 owner bytes: rlock's packed lock is also 48 bytes) and sets
 * the key's TTL to the deadline. Nothing else: no reentrancy, no queue, no
 * notification, no replication but REPLOCK's (the type saves and loads its 48
 * bytes as they are, and an AOF rewrite writes each as a FLOOR.APPLY).
 * TOKENLOCK replies with a fencing-token-sized integer as RLOCK.ACQUIRE does;
 * LOCK replies with Redis's shared `:1`. PADLOCK first runs through
 * PAD_LINES 64-byte lines of no-op instructions (a compile-time count, 0 by
 * default): the same call with more code to fetch and nothing more to do, which
 * tells what a command's code footprint alone costs. REPLOCK is the least a
 * module can do to replicate a lock deterministically (the token and the
 * absolute deadline, not the command): the stored value as one string in
 * `FLOOR.APPLY key value`, propagated in the command's own argument vector by
 * RedisModule_ReplicateVerbatim (its slots swapped for the call and put back),
 * the cheapest route the module API has and the one rlock takes.
 *
 * A measuring tool, not part of rlock. Built by bench/module-floor.sh.
 */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "redismodule.h"

typedef struct {
    long long deadline;
    uint64_t token;
    size_t len;
    char owner[24];
} FloorLock;

#ifndef PAD_LINES
#define PAD_LINES 0
#endif
#define STRINGIFY(x) #x
#define TEXT(x) STRINGIFY(x)

static RedisModuleType *floor_type;
static uint64_t last_token = 1760000000000000000ULL;

/* Saved and loaded whole, so that a replica can sync while locks exist. */
static void *floor_rdb_load(RedisModuleIO *io, int encver) {
    (void)encver;
    size_t len;
    char *bytes = RedisModule_LoadStringBuffer(io, &len);
    if (bytes == NULL || len != sizeof(FloorLock)) {
        if (bytes) RedisModule_Free(bytes);
        return NULL;
    }
    FloorLock *lock = RedisModule_Alloc(sizeof(*lock));
    memcpy(lock, bytes, sizeof(*lock));
    RedisModule_Free(bytes);
    return lock;
}

static void floor_rdb_save(RedisModuleIO *io, void *value) {
    RedisModule_SaveStringBuffer(io, value, sizeof(FloorLock));
}

static void floor_free(void *value) { RedisModule_Free(value); }

/* An AOF rewrite without the RDB preamble: one FLOOR.APPLY per key, the least
 * a module type can write there (RedisModule_EmitAOF is the only way). */
static void floor_aof_rewrite(RedisModuleIO *aof, RedisModuleString *key, void *value) {
    RedisModule_EmitAOF(aof, "FLOOR.APPLY", "sb", key, (const char *)value, sizeof(FloorLock));
}

/* 0 when stored (the value in *stored), 1 when the key was taken, -1 after
 * replying an error. */
static int floor_take(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, uint64_t token,
                      FloorLock **stored) {
    if (argc != 5) {
        RedisModule_WrongArity(ctx);
        return -1;
    }
    size_t optlen;
    const char *opt = RedisModule_StringPtrLen(argv[3], &optlen);
    long long ms;
    if (optlen != 2 || strncasecmp(opt, "PX", 2) != 0 ||
        RedisModule_StringToLongLong(argv[4], &ms) != REDISMODULE_OK || ms <= 0) {
        RedisModule_ReplyWithError(ctx, "ERR syntax error");
        return -1;
    }
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return 1;
    }
    size_t len;
    const char *owner = RedisModule_StringPtrLen(argv[2], &len);
    FloorLock *lock = RedisModule_Alloc(sizeof(*lock));
    lock->deadline = RedisModule_Milliseconds() + ms;
    lock->token = token;
    lock->len = len;
    memcpy(lock->owner, owner, len < sizeof(lock->owner) ? len : sizeof(lock->owner));
    RedisModule_ModuleTypeSetValue(key, floor_type, lock);
    RedisModule_SetAbsExpire(key, lock->deadline);
    RedisModule_CloseKey(key);
    *stored = lock;
    return 0;
}

static RedisModuleString *apply_name, *empty;

static int floor_rep_lock(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    uint64_t token = last_token + 1;
    FloorLock *lock;
    int taken = floor_take(ctx, argv, argc, token, &lock);
    if (taken < 0) return REDISMODULE_OK;
    if (!taken) {
        last_token = token;
        RedisModuleString *value = RedisModule_CreateString(ctx, (const char *)lock, sizeof(*lock));
        RedisModuleString *sent[4] = {argv[0], argv[2], argv[3], argv[4]};
        argv[0] = apply_name;
        argv[2] = value;
        argv[3] = argv[4] = empty;
        RedisModule_ReplicateVerbatim(ctx);
        argv[0] = sent[0];
        argv[2] = sent[1];
        argv[3] = sent[2];
        argv[4] = sent[3];
        RedisModule_FreeString(ctx, value);
    }
    return RedisModule_ReplyWithLongLong(ctx, taken ? 0 : (long long)token);
}

/* Run by the replica: FLOOR.APPLY key value [ignored ...]. */
static int floor_apply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    size_t len;
    const char *bytes = argc >= 3 ? RedisModule_StringPtrLen(argv[2], &len) : NULL;
    if (bytes == NULL || len != sizeof(FloorLock)) return RedisModule_ReplyWithError(ctx, "ERR bad value");
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    FloorLock *lock = RedisModule_Alloc(sizeof(*lock));
    memcpy(lock, bytes, sizeof(*lock));
    RedisModule_ModuleTypeSetValue(key, floor_type, lock);
    RedisModule_SetAbsExpire(key, lock->deadline);
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

static int floor_lock(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    FloorLock *lock;
    int taken = floor_take(ctx, argv, argc, 0, &lock);
    if (taken < 0) return REDISMODULE_OK;
    return RedisModule_ReplyWithLongLong(ctx, taken ? 0 : 1);
}

static int floor_token_lock(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    uint64_t token = last_token + 1;
    FloorLock *lock;
    int taken = floor_take(ctx, argv, argc, token, &lock);
    if (taken < 0) return REDISMODULE_OK;
    if (!taken) last_token = token;
    return RedisModule_ReplyWithLongLong(ctx, taken ? 0 : (long long)token);
}

/* PAD_LINES cache lines of code, each a no-op padded to the next 64-byte line. */
__attribute__((noinline)) static void floor_pad(void) {
    __asm__ volatile(".balign 64\n.rept " TEXT(PAD_LINES) "\nnop\n.balign 64\n.endr\n");
}

static int floor_pad_lock(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    floor_pad();
    return floor_token_lock(ctx, argv, argc);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "floorlock", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    RedisModuleTypeMethods methods = {
        .version = REDISMODULE_TYPE_METHOD_VERSION,
        .rdb_load = floor_rdb_load,
        .rdb_save = floor_rdb_save,
        .aof_rewrite = floor_aof_rewrite,
        .free = floor_free,
    };
    floor_type = RedisModule_CreateDataType(ctx, "floorlck1", 0, &methods);
    if (floor_type == NULL) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "floor.lock", floor_lock, "write deny-oom fast", 1, 1, 1) ==
            REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.tokenlock", floor_token_lock, "write deny-oom fast", 1,
                                  1, 1) == REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.padlock", floor_pad_lock, "write deny-oom fast", 1, 1,
                                  1) == REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.replock", floor_rep_lock, "write deny-oom fast", 1, 1,
                                  1) == REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.apply", floor_apply, "write deny-oom fast", 1, 1, 1) ==
            REDISMODULE_ERR)
        return REDISMODULE_ERR;
    apply_name = RedisModule_CreateString(NULL, "FLOOR.APPLY", 11);
    empty = RedisModule_CreateString(NULL, "", 0);
    return REDISMODULE_OK;
}
