/*
 * ggml_devices.c — ggml backend-registry queries without a link-time dependency on libggml.
 *
 * llama-cpp-python installs no headers, so the few prototypes we need are declared here with
 * opaque pointers, matching ggml/include/ggml-backend.h of the llama.cpp that llama-cpp-python
 * 0.3.36 vendors. The symbols are resolved at run time from the libraries llama_cpp already
 * loaded (dlopen RTLD_NOLOAD first, so we take a reference on the very same copy).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "skippy_internal.h"

typedef void *ggml_backend_dev_t; /* struct ggml_backend_device * */
typedef void *ggml_backend_reg_t; /* struct ggml_backend_reg * */

/* size_t             ggml_backend_dev_count(void); */
typedef size_t (*fn_dev_count)(void);
/* ggml_backend_dev_t ggml_backend_dev_get(size_t index); */
typedef ggml_backend_dev_t (*fn_dev_get)(size_t index);
/* const char *       ggml_backend_dev_name(ggml_backend_dev_t device); */
typedef const char *(*fn_dev_name)(ggml_backend_dev_t device);
/* const char *       ggml_backend_dev_description(ggml_backend_dev_t device); */
typedef const char *(*fn_dev_description)(ggml_backend_dev_t device);
/* enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
 * Declared as int and masked to 8 bits: some ggml revisions declare the enum packed (1 byte),
 * in which case only the low byte of the return register is defined. */
typedef int (*fn_dev_type)(ggml_backend_dev_t device);
/* void               ggml_backend_dev_memory(ggml_backend_dev_t device, size_t *free,
 *                                            size_t *total); */
typedef void (*fn_dev_memory)(ggml_backend_dev_t device, size_t *free_bytes, size_t *total_bytes);
/* size_t             ggml_backend_reg_count(void); */
typedef size_t (*fn_reg_count)(void);
/* ggml_backend_reg_t ggml_backend_reg_get(size_t index); */
typedef ggml_backend_reg_t (*fn_reg_get)(size_t index);
/* const char *       ggml_backend_reg_name(ggml_backend_reg_t reg); */
typedef const char *(*fn_reg_name)(ggml_backend_reg_t reg);

typedef struct ggml_api {
    fn_dev_count dev_count;
    fn_dev_get dev_get;
    fn_dev_name dev_name;
    fn_dev_description dev_description;
    fn_dev_type dev_type;
    fn_dev_memory dev_memory;
    fn_reg_count reg_count;
    fn_reg_get reg_get;
    fn_reg_name reg_name;
    skippy_ggml_set_abort_fn set_abort_callback; /* optional: older ggml has none */
} ggml_api;

static ggml_api g_api;
static _Atomic int g_resolved;
static pthread_mutex_t g_resolve_lock = PTHREAD_MUTEX_INITIALIZER; /* resolve only, never a
                                                                     producer path */

static void *lookup(void *const *handles, size_t count, const char *name) {
    for (size_t i = 0; i < count; i++) {
        if (handles[i] == NULL) continue;
        void *sym = dlsym(handles[i], name);
        if (sym != NULL) return sym;
    }
    return NULL;
}

#define MAX_LIBRARIES 16

SKIPPY_API int32_t skippy_ggml_resolve(const char *const *library_paths, size_t count) {
    if (library_paths == NULL || count == 0 || count > MAX_LIBRARIES)
        return SKIPPY_STATUS_INVALID_ARGUMENT;
    void *handles[MAX_LIBRARIES] = {0};
    for (size_t i = 0; i < count; i++) {
        if (library_paths[i] == NULL) continue;
        handles[i] = dlopen(library_paths[i], RTLD_NOW | RTLD_NOLOAD);
        if (handles[i] == NULL) handles[i] = dlopen(library_paths[i], RTLD_NOW);
    }
    ggml_api api;
    /* POSIX guarantees dlsym's void* converts to a function pointer. */
    api.dev_count = (fn_dev_count)lookup(handles, count, "ggml_backend_dev_count");
    api.dev_get = (fn_dev_get)lookup(handles, count, "ggml_backend_dev_get");
    api.dev_name = (fn_dev_name)lookup(handles, count, "ggml_backend_dev_name");
    api.dev_description = (fn_dev_description)lookup(handles, count, "ggml_backend_dev_description");
    api.dev_type = (fn_dev_type)lookup(handles, count, "ggml_backend_dev_type");
    api.dev_memory = (fn_dev_memory)lookup(handles, count, "ggml_backend_dev_memory");
    api.reg_count = (fn_reg_count)lookup(handles, count, "ggml_backend_reg_count");
    api.reg_get = (fn_reg_get)lookup(handles, count, "ggml_backend_reg_get");
    api.reg_name = (fn_reg_name)lookup(handles, count, "ggml_backend_reg_name");
    /* ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback); */
    api.set_abort_callback =
        (skippy_ggml_set_abort_fn)lookup(handles, count, "ggml_set_abort_callback");
    bool complete = api.dev_count && api.dev_get && api.dev_name && api.dev_description &&
                    api.dev_type && api.dev_memory && api.reg_count && api.reg_get && api.reg_name;
    if (!complete) {
        /* Handles we opened stay open only when they are in use; drop ours. */
        for (size_t i = 0; i < count; i++)
            if (handles[i] != NULL) dlclose(handles[i]);
        return SKIPPY_STATUS_UNSUPPORTED;
    }
    pthread_mutex_lock(&g_resolve_lock);
    if (atomic_load_explicit(&g_resolved, memory_order_acquire)) {
        /* Already resolved: keep the first set (its handles stay referenced), drop these. */
        pthread_mutex_unlock(&g_resolve_lock);
        for (size_t i = 0; i < count; i++)
            if (handles[i] != NULL) dlclose(handles[i]);
        return SKIPPY_STATUS_OK;
    }
    g_api = api; /* the handles stay open for the life of the process */
    atomic_store_explicit(&g_resolved, 1, memory_order_release);
    pthread_mutex_unlock(&g_resolve_lock);
    return SKIPPY_STATUS_OK;
}

static const ggml_api *api_or_null(void) {
    return atomic_load_explicit(&g_resolved, memory_order_acquire) ? &g_api : NULL;
}

skippy_ggml_set_abort_fn skippy_ggml_abort_setter(void) {
    const ggml_api *api = api_or_null();
    return api != NULL ? api->set_abort_callback : NULL;
}

static void copy_name(char *dst, size_t cap, const char *src) {
    if (src == NULL) src = "";
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static uint32_t device_type(const ggml_api *api, ggml_backend_dev_t dev) {
    return (uint32_t)api->dev_type(dev) & 0xffu;
}

SKIPPY_API int32_t skippy_devices_list(skippy_device_info_v1 *out, size_t max, size_t *count) {
    if (count == NULL || (out == NULL && max != 0)) return SKIPPY_STATUS_INVALID_ARGUMENT;
    *count = 0;
    const ggml_api *api = api_or_null();
    if (api == NULL) return SKIPPY_STATUS_UNSUPPORTED;
    size_t n = api->dev_count();
    *count = n;
    for (size_t i = 0; i < n && i < max; i++) {
        ggml_backend_dev_t dev = api->dev_get(i);
        skippy_device_info_v1 *info = &out[i];
        memset(info, 0, sizeof(*info));
        info->struct_size = (uint32_t)sizeof(*info);
        if (dev == NULL) continue;
        size_t free_bytes = 0, total_bytes = 0;
        api->dev_memory(dev, &free_bytes, &total_bytes);
        info->type = device_type(api, dev);
        info->memory_free = free_bytes;
        info->memory_total = total_bytes;
        copy_name(info->name, sizeof(info->name), api->dev_name(dev));
        copy_name(info->description, sizeof(info->description), api->dev_description(dev));
    }
    return n > max ? SKIPPY_STATUS_BUFFER_TOO_SMALL : SKIPPY_STATUS_OK;
}

SKIPPY_API int32_t skippy_backends_list(char (*names)[64], size_t max, size_t *count) {
    if (count == NULL || (names == NULL && max != 0)) return SKIPPY_STATUS_INVALID_ARGUMENT;
    *count = 0;
    const ggml_api *api = api_or_null();
    if (api == NULL) return SKIPPY_STATUS_UNSUPPORTED;
    size_t n = api->reg_count();
    *count = n;
    for (size_t i = 0; i < n && i < max; i++) {
        ggml_backend_reg_t reg = api->reg_get(i);
        copy_name(names[i], 64, reg != NULL ? api->reg_name(reg) : "");
    }
    return n > max ? SKIPPY_STATUS_BUFFER_TOO_SMALL : SKIPPY_STATUS_OK;
}

int32_t skippy_ggml_select_device(int32_t n_gpu_layers, skippy_selected_device *out) {
    const ggml_api *api = api_or_null();
    if (api == NULL) return SKIPPY_STATUS_UNSUPPORTED;
    size_t n = api->dev_count();
    ggml_backend_dev_t chosen = NULL;
    if (n_gpu_layers != 0) {
        for (size_t i = 0; i < n && chosen == NULL; i++) {
            ggml_backend_dev_t dev = api->dev_get(i);
            if (dev == NULL) continue;
            uint32_t type = device_type(api, dev);
            if (type == SKIPPY_GGML_DEVICE_TYPE_GPU || type == SKIPPY_GGML_DEVICE_TYPE_IGPU)
                chosen = dev;
        }
    }
    for (size_t i = 0; i < n && chosen == NULL; i++) {
        ggml_backend_dev_t dev = api->dev_get(i);
        if (dev != NULL && device_type(api, dev) == SKIPPY_GGML_DEVICE_TYPE_CPU) chosen = dev;
    }
    if (chosen == NULL) return SKIPPY_STATUS_ERROR;
    size_t free_bytes = 0, total_bytes = 0;
    api->dev_memory(chosen, &free_bytes, &total_bytes);
    memset(out, 0, sizeof(*out));
    copy_name(out->name, sizeof(out->name), api->dev_name(chosen));
    out->type = device_type(api, chosen);
    out->memory_free = free_bytes;
    out->memory_total = total_bytes;
    return SKIPPY_STATUS_OK;
}
