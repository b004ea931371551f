/* ===========================================================================================
   Metrics: LTC's counters and metrics (torch/csrc/lazy/core/metrics.h), by name
   =========================================================================================== */

#define TB__METRIC_RECENT   64  /* samples kept per metric for the percentiles */
#define TB__METRIC_NAME_MAX 255 /* longest name in bytes */

typedef struct tb__metric {
    char *name;
    int64_t value; /* a counter's value; a metric's number of samples */
    double sum;
    double min;
    double max;
    double recent[TB__METRIC_RECENT]; /* a ring of the latest samples */
} tb__metric;

typedef struct tb__metric_table {
    tb__metric **items; /* sorted by name */
    size_t count;
    size_t cap;
} tb__metric_table;

static tb__mutex tb__metrics_mutex = TB__MUTEX_INIT;
static tb__metric_table tb__metric_counters;
static tb__metric_table tb__metric_samples;

/* The index of `name`, or where it would go (*found false). */
static size_t tb__metric_find(const tb__metric_table *table, const char *name, bool *found) {
    size_t lo = 0, hi = table->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(table->items[mid]->name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    *found = false;
    return lo;
}

/* The entry of `name`, created when missing; NULL when out of memory. Recording is best
   effort: a metric that cannot be created is dropped, and the caller's error (its operation
   succeeded) stays as it was. Caller holds the lock. */
static tb__metric *tb__metric_get(tb__metric_table *table, const char *name) {
    bool found;
    size_t at = tb__metric_find(table, name, &found);
    tb__metric *m;
    tb__saved_error saved;
    if (found) return table->items[at];
    tb__error_save(&saved);
    if (tb__grow((void **)&table->items, &table->cap, table->count + 1, sizeof(tb__metric *)) !=
        TB_OK) {
        tb__error_restore(&saved);
        return NULL;
    }
    m = (tb__metric *)tb__calloc(1, sizeof(tb__metric));
    if (m == NULL) {
        tb__error_restore(&saved);
        return NULL;
    }
    m->name = tb__strdup(name);
    if (m->name == NULL) {
        tb__free(m);
        tb__error_restore(&saved);
        return NULL;
    }
    memmove(table->items + at + 1, table->items + at, (table->count - at) * sizeof(tb__metric *));
    table->items[at] = m;
    table->count++;
    return m;
}

static const tb__metric *tb__metric_peek(const tb__metric_table *table, const char *name) {
    bool found;
    size_t at = tb__metric_find(table, name, &found);
    return found ? table->items[at] : NULL;
}

static void tb__metric_table_free(tb__metric_table *table) {
    size_t i;
    for (i = 0; i < table->count; i++) {
        tb__free(table->items[i]->name);
        tb__free(table->items[i]);
    }
    tb__free(table->items);
    table->items = NULL;
    table->count = 0;
    table->cap = 0;
}

static void tb__metric_count(const char *name, int64_t delta) {
    tb__metric *m;
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_get(&tb__metric_counters, name);
    if (m != NULL) m->value += delta;
    tb__mutex_unlock(&tb__metrics_mutex);
}

static void tb__metric_sample(const char *name, double value) {
    tb__metric *m;
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_get(&tb__metric_samples, name);
    if (m != NULL) {
        if (m->value == 0 || value < m->min) m->min = value;
        if (m->value == 0 || value > m->max) m->max = value;
        m->recent[(uint64_t)m->value % TB__METRIC_RECENT] = value;
        m->sum += value;
        m->value++;
    }
    tb__mutex_unlock(&tb__metrics_mutex);
}

static void tb__metrics_shutdown(void) {
    tb__mutex_lock(&tb__metrics_mutex);
    tb__metric_table_free(&tb__metric_counters);
    tb__metric_table_free(&tb__metric_samples);
    tb__mutex_unlock(&tb__metrics_mutex);
}

static bool tb__metric_name_ok(const char *func, const char *name) {
    size_t n;
    if (name == NULL) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: name is NULL", func);
        return false;
    }
    n = strlen(name);
    if (n == 0 || n > TB__METRIC_NAME_MAX) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "%s: name '%.40s' has %lu bytes (1..%d allowed)", func,
                  name, (unsigned long)n, TB__METRIC_NAME_MAX);
        return false;
    }
    return true;
}

TBDEF int64_t tb_metrics_counter(const char *name) {
    const tb__metric *m;
    int64_t value = 0;
    if (!tb__metric_name_ok("tb_metrics_counter", name)) return 0;
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_peek(&tb__metric_counters, name);
    if (m == NULL) m = tb__metric_peek(&tb__metric_samples, name);
    if (m != NULL) value = m->value;
    tb__mutex_unlock(&tb__metrics_mutex);
    return value;
}

TBDEF double tb_metrics_total(const char *name) {
    const tb__metric *m;
    double total = 0.0;
    if (!tb__metric_name_ok("tb_metrics_total", name)) return 0.0;
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    m = tb__metric_peek(&tb__metric_samples, name);
    if (m != NULL) {
        total = m->sum;
    } else {
        m = tb__metric_peek(&tb__metric_counters, name);
        if (m != NULL) total = (double)m->value;
    }
    tb__mutex_unlock(&tb__metrics_mutex);
    return total;
}

TBDEF void tb_metrics_reset(void) {
    tb__ensure_setup();
    tb__metrics_shutdown();
}

TBDEF void tb_metrics_add(const char *name, int64_t delta) {
    if (!tb__metric_name_ok("tb_metrics_add", name)) return;
    tb__ensure_setup();
    tb__metric_count(name, delta);
}

TBDEF void tb_metrics_sample(const char *name, double value) {
    if (!tb__metric_name_ok("tb_metrics_sample", name)) return;
    if (value != value) {
        tb__error(TB_ERR_INVALID_ARGUMENT, "tb_metrics_sample: %s: the value is NaN", name);
        return;
    }
    tb__ensure_setup();
    tb__metric_sample(name, value);
}

/* Times are in nanoseconds and shown in the largest unit below them, as LTC does. */
static void tb__metric_value_text(tb__str *s, bool is_time, double v) {
    double a = fabs(v);
    if (is_time) {
        if (a < 1e3) {
            tb__str_append(s, "%.0fns", v);
        } else if (a < 1e6) {
            tb__str_append(s, "%.3fus", v / 1e3);
        } else if (a < 1e9) {
            tb__str_append(s, "%.3fms", v / 1e6);
        } else {
            tb__str_append(s, "%.3fs", v / 1e9);
        }
    } else if (a < 1e15 && v == floor(v)) {
        tb__str_append(s, "%.0f", v);
    } else {
        tb__str_append(s, "%.6g", v);
    }
}

static int tb__metric_compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void tb__metric_report(tb__str *s, const tb__metric *m) {
    static const int percentiles[] = {1, 5, 10, 20, 50, 80, 90, 95, 99};
    size_t name_len = strlen(m->name);
    bool is_time = name_len >= 4 && strcmp(m->name + name_len - 4, "Time") == 0;
    double sorted[TB__METRIC_RECENT];
    size_t n = m->value < TB__METRIC_RECENT ? (size_t)m->value : TB__METRIC_RECENT;
    size_t i;
    tb__str_append(s, "Metric: %s\n  TotalSamples: %lld\n  Accumulator: ", m->name,
                   (long long)m->value);
    tb__metric_value_text(s, is_time, m->sum);
    tb__str_append(s, "\n  Mean: ");
    tb__metric_value_text(s, is_time, m->value > 0 ? m->sum / (double)m->value : 0.0);
    tb__str_append(s, "\n  Min: ");
    tb__metric_value_text(s, is_time, m->min);
    tb__str_append(s, "\n  Max: ");
    tb__metric_value_text(s, is_time, m->max);
    memcpy(sorted, m->recent, n * sizeof(double));
    qsort(sorted, n, sizeof(double), tb__metric_compare_double);
    tb__str_append(s, "\n  Percentiles: ");
    for (i = 0; i < sizeof(percentiles) / sizeof(percentiles[0]); i++) {
        size_t at = (size_t)((double)percentiles[i] / 100.0 * (double)(n - 1) + 0.5);
        tb__str_append(s, "%s%d%%=", i > 0 ? "; " : "", percentiles[i]);
        tb__metric_value_text(s, is_time, sorted[at]);
    }
    tb__str_append(s, "\n");
}

TBDEF char *tb_metrics_report(void) {
    tb__str s;
    size_t i;
    memset(&s, 0, sizeof(s));
    tb__ensure_setup();
    tb__mutex_lock(&tb__metrics_mutex);
    for (i = 0; i < tb__metric_samples.count; i++) {
        tb__metric_report(&s, tb__metric_samples.items[i]);
    }
    for (i = 0; i < tb__metric_counters.count; i++) {
        tb__str_append(&s, "Counter: %s\n  Value: %lld\n", tb__metric_counters.items[i]->name,
                       (long long)tb__metric_counters.items[i]->value);
    }
    tb__mutex_unlock(&tb__metrics_mutex);
    if (s.data == NULL && !s.failed) return tb__strdup("");
    return tb__str_take(&s);
}

#undef TB__METRIC_RECENT
#undef TB__METRIC_NAME_MAX
