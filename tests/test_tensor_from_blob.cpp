// Tensor::from_blob: views of memory moex does not own (the Python module's zero-copy import);
// and Tensor::from_ints's range check.
#include <gtest/gtest.h>

#include <vector>

#include "moex/error.hpp"
#include "moex/tensor.hpp"

using namespace moex;

TEST(TensorFromBlob, ViewsInPlaceAndReleasesOnceAfterTheLastView) {
  std::vector<float> mem(12);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = float(i);
  int released = 0;
  {
    Tensor t = Tensor::from_blob(mem.data(), DType::kF32, {3, 4}, {4, 1}, Device::cpu(), [&] { ++released; });
    EXPECT_EQ(t.raw(), mem.data());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.storage()->bytes(), 12 * sizeof(float));
    Tensor col = t.select(1, 2);  // a view keeps the memory
    t = Tensor();
    EXPECT_EQ(released, 0);
    EXPECT_EQ(col.to_float_vector(), (std::vector<float>{2, 6, 10}));
    mem[6] = 60;  // no copy was made
    EXPECT_EQ(col.item_double({1}), 60.0);
  }
  EXPECT_EQ(released, 1);
}

TEST(TensorFromBlob, StridedAndEmptyViews) {
  std::vector<int64_t> mem(10);
  // Every other element of a [2, 5] row-major block viewed as [2, 3] with strides {5, 2}.
  Tensor t = Tensor::from_blob(mem.data(), DType::kI64, {2, 3}, {5, 2}, Device::cpu());
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage()->bytes(), (1 + 5 + 2 * 2) * sizeof(int64_t));
  Tensor e = Tensor::from_blob(nullptr, DType::kF32, {0, 7}, {7, 1}, Device::cpu());
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.storage()->bytes(), 0u);
}

TEST(TensorFromBlob, RejectsWhatItCannotAddress) {
  float x[4] = {};
  EXPECT_THROW(Tensor::from_blob(x, DType::kF32, {2, 2}, {2}, Device::cpu()), InvalidInput);
  EXPECT_THROW(Tensor::from_blob(x, DType::kF32, {2, 2}, {-2, 1}, Device::cpu()), InvalidInput);
  EXPECT_THROW(Tensor::from_blob(x, DType::kF32, {-1, 2}, {2, 1}, Device::cpu()), InvalidInput);
  EXPECT_THROW(Tensor::from_blob(nullptr, DType::kF32, {2, 2}, {2, 1}, Device::cpu()), InvalidInput);
}

// Tensor::from_ints into int32: a value that does not fit is refused, not wrapped.
TEST(TensorFromInts, Int32RefusesValuesThatDoNotFit) {
  EXPECT_EQ(Tensor::from_ints({-2147483648LL, 2147483647LL}, {2}, DType::kI32).to_int_vector(),
            (std::vector<int64_t>{-2147483648LL, 2147483647LL}));
  EXPECT_THROW(Tensor::from_ints({1, 2147483648LL}, {2}, DType::kI32), InvalidInput);
  EXPECT_THROW(Tensor::from_ints({-2147483649LL}, {1}, DType::kI32), InvalidInput);
}
