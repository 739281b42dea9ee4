TABLES['NVIDIA H200'] = {
    '64@6144x2048': {'path': 'w8a8', 'w8a8': {'BM': 64, 'BN': 64, 'BK': 256, 'SPLIT_K': 1, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4}, 'w8a16': {'BM': 16, 'BN': 64, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4}},
    '64@2048x2048': {'path': 'w8a8', 'w8a8': {'BM': 64, 'BN': 16, 'BK': 512, 'SPLIT_K': 1, 'FIXUP': True, 'num_warps': 4, 'num_stages': 3}, 'w8a16': {'BM': 16, 'BN': 64, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4}},
    '64@11264x2048': {'path': 'w8a8', 'w8a8': {'BM': 64, 'BN': 64, 'BK': 128, 'SPLIT_K': 1, 'FIXUP': True, 'num_warps': 4, 'num_stages': 6}, 'w8a16': {'BM': 16, 'BN': 64, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4}},
    '64@2048x5632': {'path': 'w8a8', 'w8a8': {'BM': 64, 'BN': 32, 'BK': 256, 'SPLIT_K': 2, 'FIXUP': True, 'num_warps': 4, 'num_stages': 6}, 'w8a16': {'BM': 16, 'BN': 64, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4}},
}
