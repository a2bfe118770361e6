/* tessera_mpi_bench: the reference point for `tessera bench comm` — the same
 * ops, sizes, timing method (warm-up, ~50 ms per size, slowest rank's average),
 * nccl-tests bus-bandwidth factors, table and JSON records, measured with the
 * MPI library it is linked against (Open MPI on Debian). f32, sum.
 *
 *   mpirun -np 2 tessera_mpi_bench [--op allreduce ...] [-b 8] [-e 256M]
 *                                  [-n iters] [-w warmup] [--json FILE] [--check]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* kAllOps[] = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast",
                                "reduce",    "gather",    "scatter",       "sendrecv"};
enum { kNumOps = 9 };

static size_t ParseSize(const char* text) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (end && (*end == 'k' || *end == 'K')) v *= 1024;
  if (end && (*end == 'm' || *end == 'M')) v *= 1024 * 1024;
  if (end && (*end == 'g' || *end == 'G')) v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

static int IsPerRankOp(const char* op) {
  return !strcmp(op, "allgather") || !strcmp(op, "reducescatter") || !strcmp(op, "alltoall") ||
         !strcmp(op, "gather") || !strcmp(op, "scatter");
}

static double BusFactor(const char* op, int n) {
  if (!strcmp(op, "allreduce")) return n > 1 ? 2.0 * (n - 1) / n : 0;
  if (IsPerRankOp(op)) return n > 1 ? (double)(n - 1) / n : 0;
  return 1.0;
}

static void RunOnce(const char* op, size_t count, float* s, float* d, int rank, int n) {
  if (!strcmp(op, "allreduce")) {
    MPI_Allreduce(s, d, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (!strcmp(op, "allgather")) {
    MPI_Allgather(s, (int)count, MPI_FLOAT, d, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (!strcmp(op, "reducescatter")) {
    MPI_Reduce_scatter_block(s, d, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (!strcmp(op, "alltoall")) {
    MPI_Alltoall(s, (int)count, MPI_FLOAT, d, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (!strcmp(op, "broadcast")) {
    MPI_Bcast(rank == 0 ? s : d, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (!strcmp(op, "reduce")) {
    MPI_Reduce(s, d, (int)count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  } else if (!strcmp(op, "gather")) {
    MPI_Gather(s, (int)count, MPI_FLOAT, d, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (!strcmp(op, "scatter")) {
    MPI_Scatter(s, (int)count, MPI_FLOAT, d, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else {
    MPI_Sendrecv(s, (int)count, MPI_FLOAT, (rank + 1) % n, 7, d, (int)count, MPI_FLOAT,
                 (rank - 1 + n) % n, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const char* ops[kNumOps];
  int num_ops = 0;
  size_t min_bytes = 8, max_bytes = (size_t)256 << 20;
  int iters_flag = 0, warmup = 3, check = 0, alloc_mem = 0;
  const char* json_path = NULL;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--op") && v) {
      ++i;
      if (!strcmp(v, "all")) {
        for (int k = 0; k < kNumOps; ++k) ops[num_ops++] = kAllOps[k];
      } else {
        for (int k = 0; k < kNumOps; ++k) {
          if (!strcmp(v, kAllOps[k]) && num_ops < kNumOps) ops[num_ops++] = kAllOps[k];
        }
      }
    } else if ((!strcmp(a, "-b") || !strcmp(a, "--min-bytes")) && v) {
      min_bytes = ParseSize(argv[++i]);
    } else if ((!strcmp(a, "-e") || !strcmp(a, "--max-bytes")) && v) {
      max_bytes = ParseSize(argv[++i]);
    } else if ((!strcmp(a, "-n") || !strcmp(a, "--iters")) && v) {
      iters_flag = atoi(argv[++i]);
    } else if ((!strcmp(a, "-w") || !strcmp(a, "--warmup")) && v) {
      warmup = atoi(argv[++i]);
    } else if (!strcmp(a, "--json") && v) {
      json_path = argv[++i];
    } else if (!strcmp(a, "--check") || !strcmp(a, "-c")) {
      check = 1;
    } else if (!strcmp(a, "--alloc-mem")) {
      alloc_mem = 1; /* buffers from MPI_Alloc_mem (the library's own memory) */
    } else {
      if (rank == 0) fprintf(stderr, "tessera_mpi_bench: unknown argument %s\n", a);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (num_ops == 0) {
    for (int k = 0; k < kNumOps; ++k) ops[num_ops++] = kAllOps[k];
  }
  const size_t cap = max_bytes + 64;
  float* s = NULL;
  float* d = NULL;
  if (alloc_mem) {
    if (MPI_Alloc_mem((MPI_Aint)cap, MPI_INFO_NULL, &s) != MPI_SUCCESS ||
        MPI_Alloc_mem((MPI_Aint)cap, MPI_INFO_NULL, &d) != MPI_SUCCESS) {
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  } else {
    s = (float*)malloc(cap);
    d = (float*)malloc(cap);
  }
  if (!s || !d) MPI_Abort(MPI_COMM_WORLD, 3);
  for (size_t i = 0; i < cap / 4; ++i) {
    s[i] = 1.0f;
    d[i] = 0.0f;
  }
  FILE* json = NULL;
  if (rank == 0 && json_path) {
    json = fopen(json_path, "w");
    if (json) fprintf(json, "[");
  }
  int first_record = 1;
  if (rank == 0) {
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    char* nl = strchr(lib, '\n');
    if (nl) *nl = 0;
    printf("# tessera_mpi_bench: np %d, %s, dtype f32, redop sum\n", n, lib);
  }
  for (int o = 0; o < num_ops; ++o) {
    const char* op = ops[o];
    if (rank == 0) {
      printf("#\n# %s\n", op);
      printf("# %12s %12s %5s %6s %14s %11s %9s %9s %7s\n", "size", "count", "type", "redop",
             "algo", "time", "algbw", "busbw", "#wrong");
      printf("# %12s %12s %5s %6s %14s %11s %9s %9s %7s\n", "(B)", "(elements)", "", "", "",
             "(us)", "(GB/s)", "(GB/s)", "");
    }
    for (size_t size = min_bytes; size <= max_bytes; size *= 2) {
      size_t count = size / 4;
      if (IsPerRankOp(op)) count /= (size_t)n;
      if (count == 0) continue;
      if (!strcmp(op, "sendrecv") && n == 1) continue;
      const size_t bytes = IsPerRankOp(op) ? count * 4 * (size_t)n : count * 4;
      /* Warm up as tessera's benchmark does: rounds of `warmup` iterations until the
         rounds took 10 ms on the slowest rank; the last round sizes the timed loop. */
      double t0, warm_max = 0, warm_total = 0;
      do {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int i = 0; i < warmup; ++i) RunOnce(op, count, s, d, rank, n);
        double warm = MPI_Wtime() - t0;
        MPI_Allreduce(&warm, &warm_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        warm_total += warm_max;
      } while (warmup > 0 && warm_total < 0.010);
      int iters = iters_flag;
      if (iters <= 0) {
        double per = warm_max / (warmup > 0 ? warmup : 1);
        double want = 0.050 / (per > 1e-9 ? per : 1e-9);
        iters = want < 3 ? 3 : (want > 10000 ? 10000 : (int)want);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) RunOnce(op, count, s, d, rank, n);
      double elapsed = MPI_Wtime() - t0, elapsed_max = 0;
      MPI_Allreduce(&elapsed, &elapsed_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double time_us = elapsed_max * 1e6 / iters;
      double algbw = (double)bytes / (time_us * 1e-6) * 1e-9;
      double busbw = algbw * BusFactor(op, n);
      long wrong = -1;
      if (check && !strcmp(op, "allreduce")) {
        for (size_t i = 0; i < count; ++i) s[i] = (float)((rank + i) % 7);
        MPI_Allreduce(s, d, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long local = 0;
        for (size_t i = 0; i < count; ++i) {
          float expected = 0;
          for (int r = 0; r < n; ++r) expected += (float)((r + i) % 7);
          if (d[i] != expected) ++local;
        }
        MPI_Allreduce(&local, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (size_t i = 0; i < count; ++i) s[i] = 1.0f;
      }
      if (rank == 0) {
        char wrong_text[32];
        if (wrong < 0) {
          snprintf(wrong_text, sizeof(wrong_text), "N/A");
        } else {
          snprintf(wrong_text, sizeof(wrong_text), "%ld", wrong);
        }
        printf("  %12zu %12zu %5s %6s %14s %11.2f %9.2f %9.2f %7s\n", bytes, count, "f32", "sum",
               "mpi", time_us, algbw, busbw, wrong_text);
        fflush(stdout);
        if (json) {
          fprintf(json,
                  "%s\n  {\"op\":\"%s\",\"algo\":\"mpi\",\"transport\":\"mpi\",\"np\":%d,"
                  "\"dtype\":\"f32\",\"bytes\":%zu,\"time_us\":%.3f,\"algbw_gbps\":%.4f,"
                  "\"busbw_gbps\":%.4f,\"wrong\":%ld}",
                  first_record ? "" : ",", op, n, bytes, time_us, algbw, busbw,
                  wrong < 0 ? 0 : wrong);
          first_record = 0;
        }
      }
    }
  }
  if (json) {
    fprintf(json, "\n]\n");
    fclose(json);
  }
  if (alloc_mem) {
    MPI_Free_mem(s);
    MPI_Free_mem(d);
  } else {
    free(s);
    free(d);
  }
  MPI_Finalize();
  return 0;
}
