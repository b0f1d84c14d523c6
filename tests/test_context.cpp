// The Workspace of an ExecContext: grow-only, blocks handed out stay valid until it dies, and a
// call that would grow it during graph capture throws instead of allocating.
#include <gtest/gtest.h>

#include <cstring>

#include "moex/context.hpp"
#include "moex/error.hpp"

namespace moex {
namespace {

TEST(Workspace, GrowsOnlyWhenAskedForMore) {
  Workspace ws(Device::cpu());
  EXPECT_EQ(ws.capacity(), 0u);
  void* a = ws.get(1000);
  ASSERT_NE(a, nullptr);
  EXPECT_GE(ws.capacity(), 1000u);
  EXPECT_EQ(ws.get(500), a);   // smaller: the same block
  EXPECT_EQ(ws.get(1000), a);
  std::memset(a, 0x5a, 1000);  // the old block stays writable after growth (kept, not freed)
  void* b = ws.get(5000);
  EXPECT_NE(b, a);
  EXPECT_GE(ws.capacity(), 5000u);
  std::memset(a, 0xa5, 1000);
  std::memset(b, 0, 5000);
}

TEST(Workspace, RefusesToGrowWhileCapturing) {
  Workspace ws(Device::cpu());
  void* a = ws.get(256);
  EXPECT_EQ(ws.get(256, /*capturing=*/true), a);
  EXPECT_THROW(ws.get(257 + ws.capacity(), /*capturing=*/true), DeviceError);
  EXPECT_EQ(ws.get(256, true), a);  // nothing changed
}

TEST(ExecContext, OnTheHostHasNoStream) {
  const ExecContext c = ExecContext::on(Device::cpu());
  EXPECT_EQ(c.device, Device::cpu());
  EXPECT_EQ(c.stream, nullptr);
  EXPECT_EQ(c.workspace, nullptr);
  EXPECT_FALSE(c.capturing);
}

}  // namespace
}  // namespace moex
