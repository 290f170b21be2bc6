/* starinfer.c - the command-line interface. */
#include "config.h"

#include "cli.h"
#include "model/quants.h"
#include "starinfer.h"

#include <inttypes.h>
#include <starpu.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG SI_PROG

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: " PROG " COMMAND [OPTIONS]\n"
            "\n"
            "Sparse, heterogeneous LLM inference on StarPU.\n"
            "\n"
            "Commands:\n"
            "  info             summarise a GGUF model file and the StarPU workers\n"
            "  generate         generate text from a prompt (reference or StarPU engine)\n"
            "  chat             chat with a model, turns read from stdin\n"
            "  perplexity       perplexity of a model on a text file (reference CPU path)\n"
            "  synth            write a synthetic model with planted neuron activity\n"
            "  profile          count how often each FFN neuron fires over a text\n"
            "  bench            one workload under several StarPU schedulers, side by side\n"
            "  train-predictor  train activation predictors (PowerInfer layout) in C\n"
            "  eval             predictor recall/precision and perplexity per sparsity mode\n"
            "  place            choose the GPU's FFN neurons for a VRAM budget (ILP)\n"
            "  serve            serve the model over HTTP (OpenAI's API, a chat page)\n"
            "  convert          write a model's flash store (--bundle) for --dram-budget\n"
            "\n"
            "Options:\n"
            "  -h, --help       show this help (COMMAND --help: the command's help)\n"
            "  -V, --version    show the version\n"
            "\n"
            "StarPU's environment variables apply (STARPU_SCHED, STARPU_NCPU, STARPU_NCUDA, ...);\n"
            "StarPU's own notices are off unless STARPU_SILENT=0.  Under mpirun, generate, chat,\n"
            "perplexity and bench run one model across the ranks (StarPU-MPI; docs/mpi.md);\n"
            "rank 0 prints.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* StarPU's notices (perfmodel calibration, hwloc plugins, the default
     * scheduler on a GPU machine) would come before our one-line errors and
     * between the output's lines; STARPU_SILENT=0 brings them back. */
    setenv("STARPU_SILENT", "1", 0);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
        int major, minor, release;
        starpu_get_version(&major, &minor, &release);
        printf(PROG " %s (StarPU %d.%d.%d%s%s%s, CPU kernels %s)\n", si_version(), major, minor,
               release,
#ifdef SI_USE_CUDA
               ", CUDA codelets",
#else
               ", no CUDA codelets",
#endif
#ifdef SI_HAVE_FXT
               ", FxT traces",
#else
               ", no FxT traces",
#endif
#ifdef SI_USE_MPI
               ", StarPU-MPI"
#else
               ", no StarPU-MPI"
#endif
               ,
               si_quants_kernels());
        return 0;
    }
    /* Under mpirun: generate runs one model across the ranks (StarPU-MPI);
     * rank 0 alone prints, unless STARINFER_MPI_VERBOSE is set. */
    if (si_cli_mpi_size() > 1) {
        static const char *const across[] = {"generate", "chat", "perplexity", "bench", "info"};
        bool ok = false;
        for (size_t i = 0; i < sizeof across / sizeof across[0]; i++)
            ok = ok || !strcmp(cmd, across[i]);
        if (!ok) {
            if (si_cli_mpi_rank() == 0)
                si_cli_error("%s runs in one process; across MPI ranks (mpirun): generate, chat, "
                             "perplexity and bench",
                             cmd);
            return 1;
        }
        if (si_cli_mpi_rank() != 0 && getenv("STARINFER_MPI_VERBOSE") == NULL &&
            (freopen("/dev/null", "w", stdout) == NULL ||
             freopen("/dev/null", "w", stderr) == NULL))
            return 1;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {
        {"info", si_cmd_info},
        {"generate", si_cmd_generate},
        {"chat", si_cmd_chat},
        {"perplexity", si_cmd_perplexity},
        {"synth", si_cmd_synth},
        {"profile", si_cmd_profile},
        {"bench", si_cmd_bench},
        {"train-predictor", si_cmd_train},
        {"convert", si_cmd_convert},
        {"eval", si_cmd_eval},
        {"place", si_cmd_place},
        {"serve", si_cmd_serve},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    if (cmd[0] == '-')
        return si_cli_error("unknown option '%s' (see " PROG " --help)", cmd);
    return si_cli_error("unknown command '%s' (see " PROG " --help)", cmd);
}
