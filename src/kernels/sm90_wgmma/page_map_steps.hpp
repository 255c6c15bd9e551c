// How a grouped page map's coordinates are formed (Traits::kPageGroups,
// tensor_map.hpp's page_group_spec): a paged cache's KV head is folded into
// the map's chunks or its pages, so that five dimensions hold (64 columns,
// 8 rows, chunks, a page's 8-row groups, pages). Host and device.
#pragma once

namespace ffpa::detail::sm90_wgmma {

struct PageMapSteps {
  int head_chunks = 0;  // chunk coordinate: chunk + head x head_chunks (an NHD cache: heads D apart)
  int page_step = 1;    // page coordinate: page x page_step + head x head_step (an HND cache:
  int head_step = 0;    //   (page, head) is one index, heads apart)

  bool operator==(const PageMapSteps& other) const {
    return head_chunks == other.head_chunks && page_step == other.page_step && head_step == other.head_step;
  }
};

}  // namespace ffpa::detail::sm90_wgmma
