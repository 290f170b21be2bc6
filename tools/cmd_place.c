/* cmd_place.c - `starinfer place`: which FFN neurons go to the GPU (the ILP). */
#include "cli.h"
#include "graph/engine.h"
#include "model/model.h"
#include "placement/hwmodel.h"
#include "placement/placement.h"
#include "predict/profile.h"
#include "starinfer.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void place_usage(FILE *f)
{
    fprintf(f,
            "Usage: " SI_PROG " place -m MODEL --profile PROFILE --vram-budget SIZE -o PLACEMENT\n"
            "       " SI_PROG " place --show PLACEMENT [-m MODEL] [--neurons]\n"
            "\n"
            "Choose the FFN neurons for the GPU: PowerInfer's ILP (paper, section 6) solved\n"
            "with lp_solve.  The neurons of each layer, most active first (the profile's\n"
            "activation frequencies), go in batches of 64; the ILP maximises the activation\n"
            "mass on the GPU within the budget left after what the engine puts on the GPU\n"
            "besides neurons (itemized in the output), with each layer holding either no GPU\n"
            "neurons or at least C_l, the fewest whose GPU time saving pays for one\n"
            "synchronisation: C_l T_GPU + T_sync <= C_l T_CPU, T = neuron bytes / bandwidth.\n"
            "The bandwidths and T_sync are measured here (a CPU streaming probe; CUDA probes\n"
            "when a GPU is present, else assumed values) unless given.  Writes PowerInfer's\n"
            "GPU index file, which PowerInfer loads (blk.N.gpu_idx, blk.N.gpu_bucket,\n"
            "split.vram_capacity, magic PWRI), plus starinfer.placement.* keys (hardware\n"
            "model, objective, gap, solve time).  `generate --engine starpu --placement\n"
            "FILE` runs it.  --show summarises a placement file, PowerInfer's included.\n"
            "\n"
            "Options:\n"
            "  -m, --model FILE       the model (GGUF)\n"
            "      --profile FILE     activation profile (starinfer profile)\n"
            "      --vram-budget SIZE GPU bytes for everything the engine puts there, e.g.\n"
            "                         8G, 512M (0: every neuron on the CPU)\n"
            "  -o, --output FILE      the placement to write\n"
            "      --sparsity M       gate or predictor: the engine mode the neuron sizes are\n"
            "                         for (default: predictor when the model has one)\n"
            "  -c, --ctx-size N       context of the engine (KV cache size in the report)\n"
            "      --gpu-attention N  leave room for the attention of the first N layers\n"
            "                         and their KV caches (give generate the same N)\n"
            "      --policy P         ilp (default), hottest (most active neurons of any\n"
            "                         layer while they fit) or random (for comparisons)\n"
            "      --seed N           random policy's seed (default 1)\n"
            "      --time-limit S     seconds for the whole solve (default 10; lp_solve gets\n"
            "                         what the set-up leaves, in whole seconds); at the limit\n"
            "                         its best incumbent, else the greedy placement, is used,\n"
            "                         with a warning\n"
            "      --batch N          neurons per ILP batch (default 64)\n"
            "      --mip-gap G        relative gap at which the solver may stop (default 1e-6)\n"
            "      --no-cuts          without the chain cuts x_{b+1} <= x_b (slower)\n"
            "      --cpu-capacity SIZE  DRAM bytes for the CPU's neurons (default: no limit)\n"
            "      --threads N        CPU threads of the bandwidth probe (default: STARPU_NCPU,\n"
            "                         else the online CPUs: the engine's CPU workers)\n"
            "      --cpu-bw GB/s      CPU memory bandwidth (skip the probe)\n"
            "      --gpu-bw GB/s      GPU memory bandwidth\n"
            "      --h2d-bw GB/s      host-to-device bandwidth\n"
            "      --h2d-lat US       host-to-device latency, microseconds\n"
            "      --t-sync US        one partial-result hand-off and merge, microseconds\n"
            "      --show FILE        summarise a placement file and exit\n"
            "      --neurons          with --show: list each layer's GPU neurons\n"
            "  -h, --help             show this help\n");
}

/* The hardware model, a line per field after `prefix`: bandwidths in GB/s,
 * latencies in us, and where each value came from. */
static void print_hw(const char *prefix, const struct si_hwmodel *hw)
{
    for (int f = 0; f < SI_HW_FIELD_COUNT; f++) {
        const bool time = f == SI_HW_H2D_LAT || f == SI_HW_T_SYNC;
        printf("%s%-8s %10.3f %s (%s)\n", prefix, si_hw_field_name((enum si_hw_field)f),
               time ? hw->value[f] * 1e6 : hw->value[f] / 1e9, time ? "us  " : "GB/s",
               si_hw_source_name(hw->source[f]));
    }
}

static int show(const char *path, const char *model, bool neurons)
{
    char err[600];
    struct si_model *m = NULL;
    if (model != NULL && si_model_load(&m, model, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    struct si_placement *p = NULL;
    int rc = si_placement_read(&p, path, m, err, sizeof err);
    si_model_free(m);
    if (rc != SI_OK)
        return si_cli_error("%s", err);
    const int64_t n = si_placement_gpu_neurons(p);
    int32_t layers = 0;
    for (int32_t l = 0; l < p->n_layer; l++)
        layers += p->n_gpu[l] > 0;
    printf("placement: %s\n", path);
    printf("layers: %" PRId32 " x %" PRId32 " neurons\n", p->n_layer, p->n_ff);
    printf("vram capacity: %" PRIu64 " bytes\n", p->vram_capacity);
    printf("gpu neurons: %" PRId64 " (%.2f%%), in %" PRId32 " layers\n", n,
           100.0 * (double)n / ((double)p->n_layer * (double)p->n_ff), layers);
    if (!p->has_meta) {
        printf("starinfer keys: none (a PowerInfer GPU index)\n");
    } else {
        printf("policy: %s (%s), sparsity %s\n", p->policy, p->outcome, p->sparsity);
        printf("objective: %.6g, bound %.6g, gap %.3g, solved in %.3f s\n", p->objective, p->bound,
               p->gap, p->solve_seconds);
        printf("reserve: %" PRId64 " bytes; neuron: %" PRId64 " bytes\n", p->reserve_bytes,
               p->neuron_bytes);
        print_hw("hw ", &p->hw);
    }
    for (int32_t l = 0; neurons && l < p->n_layer; l++) {
        printf("layer %" PRId32 ": %" PRId64 ":", l, p->n_gpu[l]);
        for (int32_t i = 0; i < p->n_ff; i++)
            if (p->gpu[(size_t)l * (size_t)p->n_ff + (size_t)i])
                printf(" %" PRId32, i);
        printf("\n");
    }
    si_placement_free(p);
    return 0;
}

/* A positive rate or time for a hardware-model field. */
static bool hw_opt(const char *flag, const char *v, double scale, struct si_hwmodel *hw,
                   enum si_hw_field f)
{
    double x;
    if (!si_cli_float(flag, v, 1e-9, 1e9, &x))
        return false;
    hw->value[f] = x * scale;
    hw->source[f] = SI_HW_GIVEN;
    return true;
}

static void print_size(const char *what, int64_t b)
{
    printf("  %-11s %14" PRId64 " bytes (%.1f MiB)\n", what, b, (double)b / 1048576.0);
}

/* place's options. */
struct place_opts {
    const char *model, *profile, *output, *showf, *sparsity;
    struct si_place_params pp;
    bool budget_given, neurons;
    long long n_ctx, threads, seed, batch, attn_gpu;
    struct si_hwmodel hw; /* what was given of it */
};

/* The options of what is placed and where it goes (the files, the budget,
 * the engine's mode and context): 1 consumed, 0 not one of them, -1 after
 * an error message. */
static int place_option(struct place_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        return si_cli_opt_str(argc, argv, i, &o->model);
    if (!strcmp(a, "--profile"))
        return si_cli_opt_str(argc, argv, i, &o->profile);
    if (!strcmp(a, "-o") || !strcmp(a, "--output"))
        return si_cli_opt_str(argc, argv, i, &o->output);
    if (!strcmp(a, "--show"))
        return si_cli_opt_str(argc, argv, i, &o->showf);
    if (!strcmp(a, "--vram-budget")) {
        o->budget_given = true;
        return si_cli_opt_size(argc, argv, i, &o->pp.vram_budget);
    }
    if (!strcmp(a, "--gpu-attention"))
        return si_cli_opt_int(argc, argv, i, 1, 100000, &o->attn_gpu);
    if (!strcmp(a, "--cpu-capacity"))
        return si_cli_opt_size(argc, argv, i, &o->pp.cpu_capacity);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &o->n_ctx);
    if (!strcmp(a, "--neurons")) {
        o->neurons = true;
        return 1;
    }
    if (strcmp(a, "--sparsity"))
        return 0;
    if (si_cli_opt_str(argc, argv, i, &o->sparsity) < 0)
        return -1;
    if (strcmp(o->sparsity, "gate") && strcmp(o->sparsity, "predictor"))
        return si_cli_error("--sparsity: '%s' is not gate or predictor", o->sparsity), -1;
    return 1;
}

/* The options of the solver and of the hardware model: 1 consumed, 0 not
 * one of them, -1 after an error message. */
static int solver_option(struct place_opts *o, int argc, char **argv, int *i)
{
    static const struct {
        const char *flag;
        double scale; /* to bytes/s or seconds */
        enum si_hw_field f;
    } hw_flags[] = {{"--cpu-bw", 1e9, SI_HW_CPU_BW},
                    {"--gpu-bw", 1e9, SI_HW_GPU_BW},
                    {"--h2d-bw", 1e9, SI_HW_H2D_BW},
                    {"--h2d-lat", 1e-6, SI_HW_H2D_LAT},
                    {"--t-sync", 1e-6, SI_HW_T_SYNC}};
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--seed"))
        return si_cli_opt_int(argc, argv, i, 0, INT64_MAX, &o->seed);
    if (!strcmp(a, "--time-limit"))
        return si_cli_opt_float(argc, argv, i, 1e-3, 86400, &o->pp.time_limit);
    if (!strcmp(a, "--batch"))
        return si_cli_opt_int(argc, argv, i, 1, 1 << 20, &o->batch);
    if (!strcmp(a, "--mip-gap"))
        return si_cli_opt_float(argc, argv, i, 0, 0.5, &o->pp.mip_gap);
    if (!strcmp(a, "--threads"))
        return si_cli_opt_int(argc, argv, i, 1, 4096, &o->threads);
    if (!strcmp(a, "--no-cuts")) {
        o->pp.chain_cuts = false;
        return 1;
    }
    for (size_t k = 0; k < sizeof hw_flags / sizeof *hw_flags; k++)
        if (!strcmp(a, hw_flags[k].flag))
            return (v = si_cli_value(argc, argv, i)) != NULL &&
                           hw_opt(a, v, hw_flags[k].scale, &o->hw, hw_flags[k].f)
                       ? 1
                       : -1;
    if (strcmp(a, "--policy"))
        return 0;
    if ((v = si_cli_value(argc, argv, i)) == NULL)
        return -1;
    int pol = si_place_policy_parse(v);
    if (pol < 0)
        return si_cli_error("--policy: '%s' is not ilp, hottest or random", v), -1;
    o->pp.policy = (enum si_place_policy)pol;
    return 1;
}

/* The options into o, checked together: 0 to go on, else the exit status
 * (help: 0 printed, -1 for "exit 0"); --show's summary is printed here. */
static int place_options(struct place_opts *o, int argc, char **argv)
{
    *o = (struct place_opts){.pp = si_place_default_params(), .seed = 1, .batch = 64};
    si_hwmodel_defaults(&o->hw, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            place_usage(stdout);
            return -1;
        }
        int r = place_option(o, argc, argv, &i);
        if (r == 0)
            r = solver_option(o, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r == 0)
            return si_cli_error("place: unknown option '%s' (see starinfer place --help)", a);
    }
    if (o->neurons && o->showf == NULL)
        return si_cli_error("place: --neurons lists a file's neurons: give it with --show FILE");
    if (o->showf != NULL)
        return show(o->showf, o->model, o->neurons) == 0 ? -1 : 1;
    if (o->model == NULL)
        return si_cli_error("place: no model given (-m MODEL.gguf)");
    if (o->profile == NULL)
        return si_cli_error("place: no profile given (--profile PROFILE.gguf)");
    if (!o->budget_given)
        return si_cli_error("place: no VRAM budget given (--vram-budget SIZE)");
    if (o->output == NULL)
        return si_cli_error("place: no output given (-o PLACEMENT.gguf)");
    o->pp.seed = (uint64_t)o->seed;
    o->pp.batch = (int32_t)o->batch;
    return 0;
}

/* A placement: the model, its profile, the engine's GPU bytes besides
 * neurons (in o->pp.reserve) and the hardware model (o->pp.hw). */
struct placing {
    struct place_opts *o;
    struct si_model *m;
    struct si_profile *prof;
    struct si_engine_params ep; /* the engine the reserve is for */
    struct si_placement *pl;
};

/* The model, its profile and what the engine puts on the GPU besides
 * neurons in this mode and context; 0, or 1 after an error message. */
static int placing_load(struct placing *p)
{
    struct place_opts *o = p->o;
    char err[600];
    if (si_model_load(&p->m, o->model, err, sizeof err) != SI_OK ||
        si_profile_read(&p->prof, o->profile, p->m, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    p->ep = si_engine_default_params();
    if (o->sparsity == NULL)
        o->sparsity = p->m->has_predictor ? "predictor" : "gate";
    p->ep.mode = !strcmp(o->sparsity, "gate") ? SI_SPARSITY_GATE : SI_SPARSITY_PREDICTOR;
    p->ep.ref.n_ctx = (int32_t)o->n_ctx;
    p->ep.vram_budget = o->pp.vram_budget;
    p->ep.attn_gpu = (int32_t)o->attn_gpu;
    if (si_engine_gpu_reserve(p->m, &p->ep, &o->pp.reserve, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    o->pp.sparsity = o->sparsity;
    return 0;
}

/* The hardware model: what was not given is measured (or assumed), with
 * --threads, else STARPU_NCPU's or the online CPUs; 0, or 1 after an error
 * message. */
static int measure_hw(struct placing *p)
{
    struct place_opts *o = p->o;
    char err[600], note[256];
    if (o->threads == 0) {
        const char *nc = getenv("STARPU_NCPU");
        o->threads = nc != NULL && atoi(nc) > 0 ? atoi(nc) : sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = o->threads > 0 ? o->threads : 1;
    }
    if (si_hwmodel_measure(&o->hw, (int32_t)o->threads, p->m->hp.n_embd, note, sizeof note, err,
                           sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    o->pp.hw = o->hw;
    printf("hardware model (%lld CPU threads%s%s):\n", o->threads, note[0] ? "; " : "", note);
    print_hw("  ", &o->hw);
    return 0;
}

/* The GPU's bytes besides FFN neurons, item by item, the neurons' size and
 * C_l, the fewest neurons worth a layer's synchronisation. */
static void print_reserve(const struct placing *p)
{
    const struct si_place_params *pp = &p->o->pp;
    const struct si_hparams *hp = &p->m->hp;
    printf("GPU bytes besides FFN neurons (%s mode, context %d):\n", p->o->sparsity,
           p->ep.ref.n_ctx > 0 ? p->ep.ref.n_ctx
                               : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096));
    for (int i = 0; i < SI_GPU_ITEM_COUNT; i++) {
        if (pp->reserve.bytes[i] > 0) {
            print_size(si_gpu_item_name((enum si_gpu_item)i), pp->reserve.bytes[i]);
        } else if (pp->reserve.cpu_bytes[i] == 0) {
            printf("  %-11s %14d bytes (none in this mode)\n",
                   si_gpu_item_name((enum si_gpu_item)i), 0);
        } else {
            printf("  %-11s %14d bytes (kept on the CPU by this engine: %.1f MiB there)\n",
                   si_gpu_item_name((enum si_gpu_item)i), 0,
                   (double)pp->reserve.cpu_bytes[i] / 1048576.0);
        }
    }
    print_size("total", pp->reserve.total);
    const int64_t all = (int64_t)hp->n_layer * hp->n_ff * pp->reserve.unit_bytes;
    printf("FFN neurons: %" PRId64 " bytes each on the GPU, %.1f MiB for all %d x %d; "
           "C_l = ",
           pp->reserve.unit_bytes, (double)all / 1048576.0, hp->n_layer, hp->n_ff);
    const int64_t c = si_hwmodel_c_min(&p->o->hw, pp->reserve.unit_bytes);
    if (c == INT64_MAX)
        printf("none (the GPU is not faster per neuron: no layer uses it)\n");
    else
        printf("%" PRId64 " neurons%s\n", c,
               c > hp->n_ff ? " (more than a layer has: no layer uses the GPU)" : "");
}

/* The placement solved, summarised and written to -o; 0, or 1 after an
 * error message. */
static int placing_solve(struct placing *p)
{
    const struct si_place_params *pp = &p->o->pp;
    const struct si_hparams *hp = &p->m->hp;
    char err[600];
    if (si_place(&p->pl, p->prof, pp, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    const struct si_placement *pl = p->pl;
    const int64_t n = si_placement_gpu_neurons(pl);
    int32_t layers = 0;
    for (int32_t l = 0; l < pl->n_layer; l++)
        layers += pl->n_gpu[l] > 0;
    printf("placement (%s): %s; %" PRId64 " of %" PRId64 " neurons on the GPU (%.2f%%) in %" PRId32
           " of %d layers, %.1f MiB of the %.1f MiB budget\n",
           pl->policy, pl->outcome, n, (int64_t)hp->n_layer * hp->n_ff,
           100.0 * (double)n / ((double)hp->n_layer * (double)hp->n_ff), layers, hp->n_layer,
           (double)(n * pp->reserve.unit_bytes + (n > 0 ? pp->reserve.total : 0)) / 1048576.0,
           (double)pp->vram_budget / 1048576.0);
    if (pp->policy == SI_PLACE_ILP)
        printf("objective %.6g active neurons per token on the GPU, bound %.6g, gap %.3g, "
               "solved in %.3f s\n",
               pl->objective, pl->bound, pl->gap, pl->solve_seconds);
    else
        printf("objective %.6g active neurons per token on the GPU\n", pl->objective);
    if (strncmp(pl->outcome, "time limit", 10) == 0)
        fprintf(stderr,
                "place: warning: the ILP reached its time limit (%g s): %s used, gap "
                "%.3g\n",
                pp->time_limit, strchr(pl->outcome, ':') + 2, pl->gap);
    if (si_placement_write(pl, p->o->output, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    printf("wrote %s\n", p->o->output);
    return 0;
}

int si_cmd_place(int argc, char **argv)
{
    struct place_opts o;
    int rc = place_options(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    struct placing p = {.o = &o};
    rc = 1;
    if (placing_load(&p) == 0 && measure_hw(&p) == 0) {
        print_reserve(&p);
        rc = placing_solve(&p);
    }
    si_placement_free(p.pl);
    si_profile_free(p.prof);
    si_model_free(p.m);
    return rc;
}
