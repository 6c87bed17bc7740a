// vk_shaders_gen_driver: ggml-vulkan's own shader generator (vulkan-shaders-gen.cpp of the pinned upstream
// source, included here at build time, never copied) with the BITCOS variants of bitcos-vulkan-shaders-gen.inc
// added, compiling the variants of ONE shader source file as a Vulkan build would: the generator's defines,
// glslc flags and names. Built at run time by dev/gpu_isa.py into the cache:
//
//   g++ -std=c++17 -DUPSTREAM_GEN='"<upstream>/vulkan-shaders-gen.cpp"' -DBITCOS_GEN_INC='"<tree>/...inc"' ...
//   vk_shaders_gen_driver GLSLC SOURCE OUTDIR     prints "NAME<TAB>SPV_PATH" per variant compiled
//
// A source file only the BITCOS list names (csrc/vulkan/*.comp) compiles through bitcos_vulkan_shaders(), one
// upstream names (mul_mat_vec_tq2_0.comp, the prompt path's mul_mm.comp) through process_shaders(); the
// generator itself skips every variant of another source file, and the glslc it is given may leave a variant's
// output empty (gpu_isa.py's filter compiles only the variants measured).
#define main vulkan_shaders_gen_main
#include UPSTREAM_GEN
#undef main
#include BITCOS_GEN_INC

int main(int argc, char ** argv) {
    if (argc != 4) {
        std::cerr << "usage: " << argv[0] << " GLSLC SOURCE OUTDIR\n";
        return 2;
    }
    GLSLC             = argv[1];
    input_filepath    = argv[2];
    output_dir        = argv[3];
    generate_dep_file = false;
    process_shaders();
    bitcos_vulkan_shaders();
    for (auto & c : compiles) {
        c.wait();
    }
    if (compile_failed) {
        return 1;
    }
    for (const auto & [name, path] : shader_fnames) {
        std::cout << name << '\t' << path << '\n';
    }
    return 0;
}
