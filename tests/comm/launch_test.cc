// Launch environment: torchrun / Open MPI / PMI / Slurm variables, and the local
// launcher (rank environment, failure propagation, shared-memory cleanup).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "base/clock.h"
#include "comm/launcher.h"
#include "comm/rank_env.h"
#include "comm/transport/shm_segment.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

const char* const kVars[] = {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "PMI_RANK",
                             "PMI_SIZE",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "TESSERA_RDZV",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "OMPI_MCA_ess_base_jobid",
                             "SLURM_JOB_ID",
                             "TESSERA_JOB_ID"};

class RankEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
  }
};

TEST_F(RankEnvTest, NoLauncherIsAWorldOfOne) {
  auto env = RankEnvFromEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source, "none");
  EXPECT_EQ(env->world_size, 1);
}

TEST_F(RankEnvTest, TorchrunStyle) {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "10.0.0.7", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  auto env = RankEnvFromEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  ASSERT_TRUE(env->rdzv.has_value());
  EXPECT_EQ(env->rdzv->ToString(), "10.0.0.7:29511");
}

TEST_F(RankEnvTest, OpenMpiPmiAndSlurm) {
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  ::setenv("OMPI_MCA_ess_base_jobid", "1234", 1);
  auto env = RankEnvFromEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source, "openmpi");
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 4);
  EXPECT_EQ(env->job_id, "ompi1234");
  for (const char* v : kVars) ::unsetenv(v);
  ::setenv("PMI_RANK", "2", 1);
  ::setenv("PMI_SIZE", "3", 1);
  env = RankEnvFromEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source, "pmi");
  EXPECT_EQ(env->rank, 2);
  for (const char* v : kVars) ::unsetenv(v);
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "6", 1);
  ::setenv("SLURM_JOB_ID", "77", 1);
  env = RankEnvFromEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->source, "slurm");
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world_size, 6);
  ::setenv("SLURM_PROCID", "9", 1);  // rank >= size
  EXPECT_FALSE(RankEnvFromEnvironment().ok());
}

TEST(LauncherTest, StartsRanksWithTheirEnvironment) {
  std::string dir = "/tmp/tessera-test-" + testing::UniqueJobId("launch");
  std::filesystem::create_directories(dir);
  LaunchSpec spec;
  spec.nproc_per_node = 3;
  spec.job_id = "launchtest";
  spec.argv = {"/bin/sh", "-c",
               "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $TESSERA_JOB_ID\" > " + dir +
                   "/out$RANK"};
  auto code = LaunchLocalRanks(spec);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);
  for (int r = 0; r < 3; ++r) {
    std::ifstream in(dir + "/out" + std::to_string(r));
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, std::to_string(r) + " 3 " + std::to_string(r) + " 3 launchtest");
  }
  std::filesystem::remove_all(dir);
}

TEST(LauncherTest, OneFailingRankStopsTheOthersAndSetsTheExitCode) {
  LaunchSpec spec;
  spec.nproc_per_node = 2;
  spec.grace_ms = 500;
  spec.argv = {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"};
  int64_t start = NowNs();
  auto code = LaunchLocalRanks(spec);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 3);
  EXPECT_LT((NowNs() - start) * 1e-9, 20.0);
}

TEST(LauncherTest, RemovesLeftoverSharedMemoryOfTheJob) {
  std::string job = testing::UniqueJobId("leftover");
  {
    auto segment = ShmSegment::Create("/tessera-" + job + "-abc-r0", 2, 64 << 10, 64);
    ASSERT_TRUE(segment.ok());
    // Simulate a crash: the name must survive this object.
    ShmSegment leaked = std::move(*segment);
    std::string path = "/dev/shm/tessera-" + job + "-abc-r0";
    ASSERT_TRUE(std::filesystem::exists(path));
    EXPECT_EQ(RemoveJobSharedMemory(job), 1);
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

TEST(ShmCleanupTest, SegmentNamesAreUnlinkedOnceEveryPeerMappedThem) {
  CommOptions options = testing::TestOptions(TransportKind::kShm);
  options.job_id = testing::UniqueJobId("unlink");
  testing::RunRanks(3, options, [&](Communicator& comm) {
    ASSERT_OK(comm.Barrier());
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      EXPECT_EQ(entry.path().filename().string().find("tessera-" + options.job_id + "-"),
                std::string::npos)
          << entry.path();
    }
  });
}

}  // namespace
}  // namespace tessera::comm
