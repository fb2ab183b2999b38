/* The CPU emulator's launcher, appended after the kernel bodies (it needs pc_conv_args). */
#pragma once

typedef void (*pc_emu_kernel_t)(const pc_conv_args);
static pc_emu_kernel_t pc_emu_fn;
static const pc_conv_args *pc_emu_args;

static void pc_emu_entry() {
    pc_emu_fn(*pc_emu_args);
    pc_emu_fibers[threadIdx.x].done = true;
}

/* Run fn over the grid, block after block; inside a block, run every runnable fiber until it parks, then
 * release the first barrier group all of whose fibers are parked on it. */
extern "C" int pc_emu_launch(void *fnp, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                             const pc_conv_args *args) {
    static std::vector<char> stacks;
    const size_t stack = 256 * 1024;
    stacks.resize(stack * block);
    pc_emu_fibers.assign(block, pc_emu_fiber{});
    pc_emu_fn = (pc_emu_kernel_t)fnp;
    pc_emu_args = args;
    gridDim = {gx, gy, gz};
    blockDim = {block, 1, 1};
    const unsigned warps = (block + PC_WARP_SIZE - 1) / PC_WARP_SIZE;
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = {x, y, z};
                for (unsigned t = 0; t < block; ++t) {
                    pc_emu_fiber &f = pc_emu_fibers[t];
                    f.wait = 0, f.done = false;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = &stacks[t * stack];
                    f.ctx.uc_stack.ss_size = stack;
                    f.ctx.uc_link = &pc_emu_sched;
                    makecontext(&f.ctx, pc_emu_entry, 0);
                }
                for (;;) {
                    for (unsigned t = 0; t < block; ++t) {
                        pc_emu_fiber &f = pc_emu_fibers[t];
                        if (f.done || f.wait) continue;
                        threadIdx = {t, 0, 0};
                        swapcontext(&pc_emu_sched, &f.ctx);
                    }
                    unsigned done = 0, at_block = 0;
                    std::vector<unsigned> at_warp(warps, 0);
                    for (unsigned t = 0; t < block; ++t) {
                        const pc_emu_fiber &f = pc_emu_fibers[t];
                        done += f.done;
                        at_block += f.wait == 1;
                        if (f.wait >= 2) at_warp[f.wait - 2]++;
                    }
                    if (done == block) break;
                    int release = 0;
                    if (at_block == block) release = 1; /* every thread (CUDA: all non-exited) is at __syncthreads */
                    for (unsigned w = 0; w < warps && !release; ++w)
                        if (at_warp[w] == PC_WARP_SIZE) release = 2 + (int)w;
                    if (!release) {
                        fprintf(stderr, "pc_emu: deadlock in block (%u,%u,%u): %u done, %u at the barrier\n", x, y, z,
                                done, at_block);
                        return 1;
                    }
                    for (auto &f : pc_emu_fibers)
                        if (f.wait == release) f.wait = 0;
                }
            }
    return 0;
}
